//! One consumer group of the next-generation protocol (KIP-848), pure and
//! deterministic like `group.rs`: every entry point takes `now_ms` and a
//! view of the topics; nothing waits. Members heartbeat
//! (ConsumerGroupHeartbeat); the broker assigns.
//!
//! # Epochs
//!
//! - The **group epoch** moves when what the assignment depends on moves: a
//!   member joins or leaves, a subscription changes, a subscribed topic
//!   appears or gains partitions.
//! - The **assignment epoch** is the group epoch the current *target
//!   assignment* was computed for. When it lags, the next heartbeat
//!   computes a new target (assignor `uniform` or `range`).
//! - Each **member epoch** says which target the member has reached.
//!
//! # Reconciliation (Kafka's `CurrentAssignmentBuilder`)
//!
//! A member moves toward its target one heartbeat at a time, and a
//! partition is never owned by two members:
//!
//! ```text
//!              target has moved
//!   Stable ───────────────────────► revokes? ──yes──► UnrevokedPartitions
//!     ▲                                │ no             │ client reports it no
//!     │                                ▼                │ longer owns them
//!     │      all free ◄───── takes what is free ◄───────┘ (released)
//!     └──────────────── UnreleasedPartitions (others still own some)
//! ```
//!
//! - Partitions a member must give up are *revoked first*: its epoch stays
//!   until it reports (in `topic_partitions`) that it let them go; they are
//!   owned by it meanwhile. A member that does not within its rebalance
//!   timeout is fenced (removed).
//! - Partitions still owned by another member are *not given* yet
//!   (UnreleasedPartitions); the member takes them on a later heartbeat,
//!   once released. Partitions it keeps are never revoked along the way.
//!
//! # Membership
//!
//! Epoch 0 joins (a v0 member gets its id from the broker; a v1 member
//! brings its own), -1 leaves, -2 is a static member's temporary leave (its
//! assignment waits a session timeout for the same instance id). An epoch
//! ahead of the member's, or behind it other than its previous epoch with
//! partitions it still has, is FENCED_MEMBER_EPOCH; an unknown member is
//! UNKNOWN_MEMBER_ID. A member not heard from for the session timeout
//! leaves the group.
//!
//! Subscriptions are topic names or a regular expression (RE2 syntax, as
//! Kafka's RE2J), matched on the broker against every topic; a matching
//! topic created later joins the subscription at the next heartbeat after
//! `REGEX_REFRESH_MS`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use kafka_protocol::ResponseError as E;

pub type TopicId = [u8; 16];
/// Partitions by topic id.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// The server-side assignors, as Kafka names them.
pub const ASSIGNORS: [&str; 2] = ["uniform", "range"];
/// A regular expression subscription is matched again this often.
pub const REGEX_REFRESH_MS: i64 = 10_000;
/// Longest subscription regex accepted.
pub const MAX_REGEX_LEN: usize = 1024;
/// Most distinct regular expressions the members of one group may use.
pub const MAX_GROUP_REGEXES: usize = 32;
/// Most topic names one member may subscribe to.
pub const MAX_SUBSCRIBED_NAMES: usize = 100_000;

/// What the group needs to know of topics.
pub trait Topics {
    /// (id, partition count) of the topic named `name`.
    fn by_name(&self, name: &str) -> Option<(TopicId, i32)>;
    /// (name, partition count) of the topic with id `id`.
    fn by_id(&self, id: &TopicId) -> Option<(String, i32)>;
    /// Calls `f` with every topic name.
    fn each_name(&self, f: &mut dyn FnMut(&str));
    /// Moves whenever a topic is created, deleted or gains partitions.
    fn version(&self) -> u64;
}

/// Compiles a subscription regex with Kafka's bounds, or says why not.
pub fn compile_regex(re: &str) -> Result<regex::Regex, String> {
    if re.len() > MAX_REGEX_LEN {
        return Err("the regular expression is too long".into());
    }
    regex::RegexBuilder::new(re).size_limit(1 << 20).build().map_err(|e| format!("invalid regular expression: {e}"))
}

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub session_timeout_ms: i64,
    pub heartbeat_interval_ms: i32,
    pub max_size: usize,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig { session_timeout_ms: 45_000, heartbeat_interval_ms: 5_000, max_size: 1000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    UnrevokedPartitions,
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub subscribed_names: BTreeSet<String>,
    pub regex: Option<String>,
    pub assignor: Option<String>,
    pub epoch: i32,
    previous_epoch: i32,
    pub state: MemberState,
    pub assigned: Assignment,
    pub pending_revocation: Assignment,
    last_heartbeat_ms: i64,
    revoke_deadline_ms: Option<i64>,
    /// A static member that left with epoch -2: kept until this for its
    /// instance to come back.
    static_leave_until_ms: Option<i64>,
}

/// A ConsumerGroupHeartbeat, as the state machine needs it.
#[derive(Debug, Clone, Default)]
pub struct HeartbeatArgs {
    pub version: i16,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    /// None: unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// What the member owns now; None: unchanged.
    pub owned: Option<Vec<(TopicId, Vec<i32>)>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeartbeatResult {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it changed or the request was full.
    pub assignment: Option<Vec<(TopicId, Vec<i32>)>>,
}

#[derive(Debug)]
struct SubsCache {
    members_version: u64,
    topics_version: u64,
    per_member: BTreeMap<String, BTreeSet<String>>,
    /// Of the subscribed topics that exist: names, ids, partition counts.
    fingerprint: u64,
}

#[derive(Debug)]
pub struct ConsumerGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, Member>,
    statics: HashMap<String, String>,
    target: HashMap<String, Assignment>,
    /// Who owns each partition (assigned or being revoked): at most one.
    owners: HashMap<(TopicId, i32), String>,
    /// What the subscribed topics looked like when last looked at, and the
    /// group epoch then: a change of membership or subscription moves the
    /// epoch once, not again when the fingerprint follows it.
    topics_fingerprint: u64,
    epoch_at_fingerprint: i32,
    /// Regex → (compiled, matching topics, when matched).
    regexes: HashMap<String, (regex::Regex, BTreeSet<String>, i64)>,
    /// Each member's subscribed topics, and what they were computed from
    /// (members' subscriptions, topic metadata, regex matches): recomputed
    /// only when one of those moved, not on every heartbeat.
    subs: Option<SubsCache>,
    /// Moves with every change of membership or subscription.
    members_version: u64,
    pub assignor: &'static str,
    pub empty_since_ms: i64,
    pub commits: u64,
}

fn err(e: E) -> i16 {
    e.code()
}

fn failure(e: E, message: &str) -> HeartbeatResult {
    HeartbeatResult { error: e.code(), message: Some(message.to_owned()), member_epoch: -1, ..Default::default() }
}

fn flat(a: &Assignment) -> BTreeSet<(TopicId, i32)> {
    a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect()
}

fn build(tps: impl IntoIterator<Item = (TopicId, i32)>) -> Assignment {
    let mut a = Assignment::new();
    for (t, p) in tps {
        a.entry(t).or_default().insert(p);
    }
    a
}

fn listed(a: &Assignment) -> Vec<(TopicId, Vec<i32>)> {
    a.iter().map(|(t, ps)| (*t, ps.iter().copied().collect())).collect()
}

impl ConsumerGroup {
    pub fn new(id: String, now_ms: i64) -> ConsumerGroup {
        ConsumerGroup {
            id,
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            statics: HashMap::new(),
            target: HashMap::new(),
            owners: HashMap::new(),
            topics_fingerprint: 0,
            epoch_at_fingerprint: 0,
            regexes: HashMap::new(),
            subs: None,
            members_version: 0,
            assignor: ASSIGNORS[0],
            empty_since_ms: now_ms,
            commits: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Kafka's consumer group states.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.epoch != self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The target assignment of a member (for ConsumerGroupDescribe).
    pub fn target_of(&self, member: &str) -> Assignment {
        self.target.get(member).cloned().unwrap_or_default()
    }

    /// Handles a ConsumerGroupHeartbeat.
    pub fn heartbeat(&mut self, cfg: &ConsumerConfig, now: i64, topics: &dyn Topics, mut a: HeartbeatArgs, new_member_id: impl FnOnce() -> String) -> HeartbeatResult {
        if let Err(e) = validate(&a) {
            return e;
        }
        if let Some(re) = a.subscribed_topic_regex.as_ref().filter(|r| !r.is_empty() && !self.regexes.contains_key(*r)) {
            let distinct: BTreeSet<&String> = self.members.values().filter_map(|m| m.regex.as_ref()).collect();
            if distinct.len() >= MAX_GROUP_REGEXES {
                return failure(E::InvalidRegularExpression, "too many distinct regular expressions in the group");
            }
            if let Err(e) = compile_regex(re) {
                return failure(E::InvalidRegularExpression, &e);
            }
        }
        if a.member_epoch == -1 || a.member_epoch == -2 {
            return self.leave(cfg, now, &a);
        }
        let is_new = a.member_epoch == 0;
        if is_new {
            if let Some(instance) = a.instance_id.clone() {
                if let Some(old) = self.statics.get(&instance).cloned() {
                    if old != a.member_id {
                        let left = self.members.get(&old).is_some_and(|m| m.static_leave_until_ms.is_some());
                        if !left {
                            return failure(E::UnreleasedInstanceId, "the instance id is in use by another member");
                        }
                        // The same instance back: it takes over its
                        // predecessor's partitions and epoch.
                        let id = if a.member_id.is_empty() { new_member_id() } else { a.member_id.clone() };
                        if self.members.contains_key(&id) {
                            // The id is another member's: that one starts
                            // over (as a rejoin with its id would).
                            self.remove(&id);
                            self.epoch += 1;
                        }
                        let mut m = self.members.remove(&old).expect("static mapping");
                        for tp in flat(&m.assigned).into_iter().chain(flat(&m.pending_revocation)) {
                            self.owners.insert(tp, id.clone());
                        }
                        if let Some(t) = self.target.remove(&old) {
                            self.target.insert(id.clone(), t);
                        }
                        m.id = id.clone();
                        m.static_leave_until_ms = None;
                        m.last_heartbeat_ms = now;
                        self.members.insert(id.clone(), m);
                        self.statics.insert(instance, id.clone());
                        a.member_id = id;
                        a.member_epoch = self.members[&a.member_id].epoch;
                        self.members_version += 1;
                        // Its subscription may have changed meanwhile.
                        return self.heartbeat_known(cfg, now, topics, a, Entry::Returning);
                    }
                }
            }
            if !a.member_id.is_empty() && self.members.contains_key(&a.member_id) {
                // A member starting over with its id: the old one goes.
                self.remove(&a.member_id.clone());
                self.epoch += 1;
            }
            if a.subscribed_topic_names.as_ref().is_some_and(|n| n.len() > MAX_SUBSCRIBED_NAMES) {
                return failure(E::InvalidRequest, "too many subscribed topics");
            }
            if self.members.len() >= cfg.max_size {
                return failure(E::GroupMaxSizeReached, "the group is full");
            }
            let id = if a.member_id.is_empty() { new_member_id() } else { a.member_id.clone() };
            if let Some(i) = &a.instance_id {
                self.statics.insert(i.clone(), id.clone());
            }
            self.members.insert(
                id.clone(),
                Member {
                    id: id.clone(),
                    instance_id: a.instance_id.clone(),
                    rack_id: None,
                    client_id: a.client_id.clone(),
                    client_host: a.client_host.clone(),
                    rebalance_timeout_ms: a.rebalance_timeout_ms,
                    subscribed_names: BTreeSet::new(),
                    regex: None,
                    assignor: None,
                    epoch: 0,
                    previous_epoch: 0,
                    state: MemberState::Stable,
                    assigned: Assignment::new(),
                    pending_revocation: Assignment::new(),
                    last_heartbeat_ms: now,
                    revoke_deadline_ms: None,
                    static_leave_until_ms: None,
                },
            );
            self.epoch += 1;
            self.members_version += 1;
            a.member_id = id;
            return self.heartbeat_known(cfg, now, topics, a, Entry::New);
        }
        if let Some(i) = &a.instance_id {
            match self.statics.get(i) {
                None => return failure(E::UnknownMemberId, "unknown static member"),
                Some(current) if *current != a.member_id => return failure(E::FencedInstanceId, "the instance id belongs to another member"),
                Some(_) => {}
            }
        }
        let Some(m) = self.members.get(&a.member_id).filter(|m| m.static_leave_until_ms.is_none()) else {
            return failure(E::UnknownMemberId, "unknown member");
        };
        // Kafka's epoch check: ahead is fenced; behind only by one target,
        // and only with partitions the member still has (the answer with
        // the new epoch was lost).
        if a.member_epoch > m.epoch {
            return failure(E::FencedMemberEpoch, "the member epoch is ahead of the group's");
        }
        if a.member_epoch < m.epoch {
            // Without its owned partitions the request proves nothing:
            // fenced, as Kafka's `isSubset(null)`.
            let subset = a.owned.as_ref().is_some_and(|owned| owned.iter().all(|(t, ps)| ps.iter().all(|p| m.assigned.get(t).is_some_and(|s| s.contains(p)))));
            if a.member_epoch != m.previous_epoch || !subset {
                return failure(E::FencedMemberEpoch, "the member epoch is stale");
            }
        }
        if a.subscribed_topic_names.as_ref().is_some_and(|n| n.len() > MAX_SUBSCRIBED_NAMES) {
            return failure(E::InvalidRequest, "too many subscribed topics");
        }
        self.heartbeat_known(cfg, now, topics, a, Entry::Known)
    }

    fn heartbeat_known(&mut self, cfg: &ConsumerConfig, now: i64, topics: &dyn Topics, a: HeartbeatArgs, entry: Entry) -> HeartbeatResult {
        let joined = entry != Entry::Known;
        let id = a.member_id.clone();
        // Take the request's changes.
        let mut changed = false;
        {
            let m = self.members.get_mut(&id).expect("member");
            m.last_heartbeat_ms = now;
            if a.rebalance_timeout_ms >= 0 {
                m.rebalance_timeout_ms = a.rebalance_timeout_ms;
            }
            if a.rack_id.is_some() {
                m.rack_id = a.rack_id.clone();
            }
            if let Some(names) = &a.subscribed_topic_names {
                let names: BTreeSet<String> = names.iter().cloned().collect();
                if names != m.subscribed_names {
                    m.subscribed_names = names;
                    changed = true;
                }
            }
            if let Some(re) = &a.subscribed_topic_regex {
                let re = (!re.is_empty()).then(|| re.clone());
                if re != m.regex {
                    m.regex = re;
                    changed = true;
                }
            }
            if let Some(s) = &a.server_assignor {
                m.assignor = Some(s.clone());
            }
        }
        if changed {
            self.members_version += 1;
            if entry != Entry::New {
                self.epoch += 1;
            }
        }
        // Topics: a subscribed topic that appeared or grew moves the epoch,
        // unless the epoch already moved since the fingerprint was taken
        // (a member joined or left, a subscription changed).
        let fingerprint = self.fingerprint(now, topics);
        if fingerprint != self.topics_fingerprint && self.epoch == self.epoch_at_fingerprint {
            self.epoch += 1;
        }
        self.topics_fingerprint = fingerprint;
        self.epoch_at_fingerprint = self.epoch;
        if self.epoch > self.assignment_epoch {
            self.compute_target(now, topics);
        }
        let before = self.members[&id].assigned.clone();
        self.reconcile(&id, now, a.owned.as_deref());
        let m = &self.members[&id];
        let full = joined || (a.rebalance_timeout_ms != -1 && (a.subscribed_topic_names.is_some() || a.subscribed_topic_regex.is_some()) && a.owned.is_some());
        // A member that reports owning other than what it was given missed
        // an answer: it gets its assignment again.
        let astray = a.owned.as_ref().is_some_and(|o| build(o.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))) != m.assigned);
        HeartbeatResult {
            error: 0,
            message: None,
            member_id: id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: cfg.heartbeat_interval_ms,
            assignment: (full || astray || m.assigned != before).then(|| listed(&m.assigned)),
        }
    }

    fn leave(&mut self, cfg: &ConsumerConfig, now: i64, a: &HeartbeatArgs) -> HeartbeatResult {
        // A static member leaves as its instance: the member id must be the
        // one the instance maps to (Kafka's FENCED_INSTANCE_ID otherwise).
        let id = match &a.instance_id {
            Some(i) => match self.statics.get(i) {
                None => return failure(E::UnknownMemberId, "unknown static member"),
                Some(id) if *id != a.member_id => return failure(E::FencedInstanceId, "the instance id belongs to another member"),
                Some(id) => id.clone(),
            },
            None => a.member_id.clone(),
        };
        let Some(m) = self.members.get(&id) else { return failure(E::UnknownMemberId, "unknown member") };
        if a.member_epoch == -2 && m.instance_id.is_some() {
            // A static member's temporary leave: its partitions wait for
            // it (no rebalance) until its session would end.
            let m = self.members.get_mut(&id).expect("member");
            m.static_leave_until_ms = Some(now + cfg.session_timeout_ms);
            return HeartbeatResult { member_id: id, member_epoch: -2, heartbeat_interval_ms: 0, ..Default::default() };
        }
        self.remove(&id);
        self.epoch += 1;
        if self.members.is_empty() {
            self.empty_since_ms = now;
        }
        HeartbeatResult { member_id: id, member_epoch: -1, heartbeat_interval_ms: 0, ..Default::default() }
    }

    /// Takes a member out: its partitions are free at once (the client
    /// stopped fetching them when it left or was fenced).
    fn remove(&mut self, id: &str) {
        self.members_version += 1;
        if let Some(m) = self.members.remove(id) {
            if let Some(i) = &m.instance_id {
                if self.statics.get(i).map(String::as_str) == Some(id) {
                    self.statics.remove(i);
                }
            }
        }
        self.owners.retain(|_, owner| owner != id);
        self.target.remove(id);
    }

    /// Expires members: silent ones after the session timeout, static ones
    /// that left and did not come back, and members that did not revoke
    /// within their rebalance timeout.
    pub fn tick(&mut self, cfg: &ConsumerConfig, now: i64) {
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                let silent = now - m.last_heartbeat_ms >= cfg.session_timeout_ms;
                let gone = m.static_leave_until_ms.is_some_and(|d| now >= d);
                let stuck = m.revoke_deadline_ms.is_some_and(|d| now >= d);
                silent || gone || stuck
            })
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "consumer group member expired or fenced");
            self.remove(&id);
            self.epoch += 1;
            if self.members.is_empty() {
                self.empty_since_ms = now;
            }
        }
    }

    pub fn next_deadline(&self, cfg: &ConsumerConfig) -> Option<i64> {
        self.members
            .values()
            .flat_map(|m| [Some(m.last_heartbeat_ms + cfg.session_timeout_ms), m.static_leave_until_ms, m.revoke_deadline_ms])
            .flatten()
            .min()
    }

    /// The topics some member subscribes to (names and regex matches).
    /// Recomputed only when membership, subscriptions or topics moved, or
    /// a regex is due to be matched again; regexes are matched in one walk
    /// over the topic names.
    fn subscribed(&mut self, now: i64, topics: &dyn Topics) -> &BTreeMap<String, BTreeSet<String>> {
        let regexes: BTreeSet<String> = self.members.values().filter_map(|m| m.regex.clone()).collect();
        self.regexes.retain(|r, _| regexes.contains(r));
        let stale: Vec<String> = regexes.into_iter().filter(|r| self.regexes.get(r).is_none_or(|(_, _, at)| now - at >= REGEX_REFRESH_MS)).collect();
        let mut rematched = false;
        if !stale.is_empty() {
            // Validated on the way in; one that does not compile (never, in
            // practice) matches nothing.
            let compiled: Vec<(String, regex::Regex)> = stale.into_iter().filter_map(|r| compile_regex(&r).ok().map(|c| (r, c))).collect();
            let mut matched: Vec<BTreeSet<String>> = vec![BTreeSet::new(); compiled.len()];
            topics.each_name(&mut |name| {
                for (i, (_, re)) in compiled.iter().enumerate() {
                    if re.is_match(name) {
                        matched[i].insert(name.to_owned());
                    }
                }
            });
            for ((r, re), m) in compiled.into_iter().zip(matched) {
                rematched |= self.regexes.get(&r).is_none_or(|(_, old, _)| *old != m);
                self.regexes.insert(r, (re, m, now));
            }
        }
        let fresh = self.subs.as_ref().is_some_and(|c| c.members_version == self.members_version && c.topics_version == topics.version()) && !rematched;
        if !fresh {
            let mut per_member = BTreeMap::new();
            for m in self.members.values() {
                let mut names = m.subscribed_names.clone();
                if let Some((_, matched, _)) = m.regex.as_ref().and_then(|r| self.regexes.get(r)) {
                    names.extend(matched.iter().cloned());
                }
                per_member.insert(m.id.clone(), names);
            }
            let all: BTreeSet<&String> = per_member.values().flatten().collect();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for name in all {
                if let Some((id, n)) = topics.by_name(name) {
                    (name, id, n).hash(&mut h);
                }
            }
            self.subs = Some(SubsCache { members_version: self.members_version, topics_version: topics.version(), per_member, fingerprint: h.finish() });
        }
        &self.subs.as_ref().expect("computed").per_member
    }

    /// The subscribed topics' fingerprint, computed with the subscription
    /// cache (so only when that is recomputed).
    fn fingerprint(&mut self, now: i64, topics: &dyn Topics) -> u64 {
        self.subscribed(now, topics);
        self.subs.as_ref().expect("computed").fingerprint
    }

    /// A new target assignment for the group epoch.
    fn compute_target(&mut self, now: i64, topics: &dyn Topics) {
        let subs = self.subscribed(now, topics).clone();
        // The assignor most members ask for (ties: Kafka's default first).
        let mut votes: HashMap<&str, usize> = HashMap::new();
        for m in self.members.values() {
            if let Some(a) = m.assignor.as_deref().and_then(|a| ASSIGNORS.iter().find(|x| **x == a)) {
                *votes.entry(a).or_default() += 1;
            }
        }
        self.assignor = ASSIGNORS.iter().copied().max_by_key(|a| (votes.get(a).copied().unwrap_or(0), std::cmp::Reverse(ASSIGNORS.iter().position(|x| x == a)))).unwrap_or(ASSIGNORS[0]);
        let members: Vec<(String, BTreeSet<(TopicId, i32)>)> = self
            .members
            .keys()
            .map(|id| {
                let tps = subs[id].iter().filter_map(|n| topics.by_name(n)).flat_map(|(t, n)| (0..n).map(move |p| (t, p))).collect();
                (id.clone(), tps)
            })
            .collect();
        let previous: HashMap<String, BTreeSet<(TopicId, i32)>> = self.target.iter().map(|(id, a)| (id.clone(), flat(a))).collect();
        self.target = match self.assignor {
            "range" => range(&members),
            _ => uniform(&members, &previous),
        }
        .into_iter()
        .map(|(id, tps)| (id, build(tps)))
        .collect();
        self.assignment_epoch = self.epoch;
        tracing::debug!(group = %self.id, epoch = self.epoch, assignor = self.assignor, members = members.len(), "new target assignment");
    }

    /// Moves a member toward its target as far as it can go now.
    fn reconcile(&mut self, id: &str, now: i64, owned: Option<&[(TopicId, Vec<i32>)]>) {
        let target = flat(&self.target_of(id));
        let m = self.members.get_mut(id).expect("member");
        if m.state == MemberState::UnrevokedPartitions {
            let still = match owned {
                None => true,
                Some(owned) => owned.iter().any(|(t, ps)| ps.iter().any(|p| m.pending_revocation.get(t).is_some_and(|s| s.contains(p)))),
            };
            if still {
                return;
            }
            // Revoked: the partitions are free for others.
            for tp in flat(&std::mem::take(&mut m.pending_revocation)) {
                if self.owners.get(&tp).map(String::as_str) == Some(id) {
                    self.owners.remove(&tp);
                }
            }
            m.revoke_deadline_ms = None;
            m.state = MemberState::Stable;
        }
        let current = flat(&m.assigned);
        if m.epoch != self.assignment_epoch {
            let revoking: BTreeSet<_> = current.difference(&target).copied().collect();
            if !revoking.is_empty() {
                m.assigned = build(current.intersection(&target).copied());
                m.pending_revocation = build(revoking);
                m.state = MemberState::UnrevokedPartitions;
                m.revoke_deadline_ms = Some(now + m.rebalance_timeout_ms.max(0) as i64);
                return;
            }
            m.previous_epoch = m.epoch;
            m.epoch = self.assignment_epoch;
        }
        // Take what is free of the target.
        let mut assigned = flat(&m.assigned);
        let mut waiting = false;
        for tp in target.difference(&current) {
            match self.owners.get(tp) {
                Some(owner) if owner != id => waiting = true,
                _ => {
                    self.owners.insert(*tp, id.to_owned());
                    assigned.insert(*tp);
                }
            }
        }
        m.assigned = build(assigned);
        m.state = if waiting { MemberState::UnreleasedPartitions } else { MemberState::Stable };
    }

    /// Whether an OffsetCommit (or, `transactional`, a TxnOffsetCommit) from
    /// this member and epoch may commit (Kafka's `ConsumerGroup.validateOffsetCommit`).
    pub fn validate_commit(&self, epoch: i32, member_id: &str, transactional: bool, version: i16) -> Result<(), i16> {
        if epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let Some(m) = self.members.get(member_id) else { return Err(err(E::UnknownMemberId)) };
        if !transactional && version < 9 {
            return Err(err(E::UnsupportedVersion));
        }
        if epoch != m.epoch {
            return Err(if transactional { err(E::IllegalGeneration) } else { err(E::StaleMemberEpoch) });
        }
        Ok(())
    }

    /// OffsetFetch with a member (v9+): the member must exist at that epoch.
    pub fn validate_fetch(&self, epoch: i32, member_id: Option<&str>) -> Result<(), i16> {
        if epoch < 0 && member_id.is_none() {
            return Ok(());
        }
        let m = member_id.and_then(|id| self.members.get(id)).ok_or(err(E::UnknownMemberId))?;
        if m.epoch != epoch {
            return Err(err(E::StaleMemberEpoch));
        }
        Ok(())
    }

    /// Checks that nothing is owned twice and owners are members (tests).
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut seen = std::collections::HashSet::new();
        for m in self.members.values() {
            for tp in flat(&m.assigned).into_iter().chain(flat(&m.pending_revocation)) {
                assert!(seen.insert(tp), "{tp:?} owned twice");
                assert_eq!(self.owners.get(&tp), Some(&m.id), "owners map agrees");
            }
        }
        assert_eq!(seen.len(), self.owners.len(), "no stale owners");
    }
}

/// How a heartbeat reached its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// A new member (the epoch moved for it already).
    New,
    /// A static member back under a new id (no epoch move yet).
    Returning,
    Known,
}

/// The request's own bounds and shapes (Kafka's
/// `throwIfConsumerGroupHeartbeatRequestIsInvalid`); the regex itself is
/// compiled by the group (once per distinct regex) and by the handler.
pub fn validate(a: &HeartbeatArgs) -> Result<(), HeartbeatResult> {
    let invalid = |m: &str| Err(failure(E::InvalidRequest, m));
    if a.version >= 1 && a.member_id.is_empty() {
        return invalid("the member id is required (v1)");
    }
    if a.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return invalid("the instance id may not be empty");
    }
    match a.member_epoch {
        0 => {
            if a.rebalance_timeout_ms < 0 {
                return invalid("rebalance timeout required when joining");
            }
            if a.subscribed_topic_names.is_none() && a.subscribed_topic_regex.is_none() {
                return invalid("a subscription is required when joining");
            }
            if a.owned.as_ref().is_some_and(|o| !o.is_empty()) {
                return invalid("a joining member owns nothing");
            }
        }
        -2 if a.instance_id.is_none() => return invalid("only static members leave with epoch -2"),
        -2 | -1 => {}
        e if e < 0 => return invalid("unknown member epoch"),
        _ => {
            if a.member_id.is_empty() {
                return invalid("the member id is required");
            }
        }
    }
    if let Some(s) = &a.server_assignor {
        if !ASSIGNORS.contains(&s.as_str()) {
            return Err(failure(E::UnsupportedAssignor, "unknown server assignor"));
        }
    }
    if a.subscribed_topic_regex.as_ref().is_some_and(|re| re.len() > MAX_REGEX_LEN) {
        return Err(failure(E::InvalidRegularExpression, "the regular expression is too long"));
    }
    Ok(())
}

/// `uniform`: balanced (counts differ by at most one among members that
/// could take a partition) and sticky (a member keeps what it had while
/// that stays balanced).
fn uniform(members: &[(String, BTreeSet<(TopicId, i32)>)], previous: &HashMap<String, BTreeSet<(TopicId, i32)>>) -> HashMap<String, BTreeSet<(TopicId, i32)>> {
    let mut out: HashMap<String, BTreeSet<(TopicId, i32)>> = members.iter().map(|(id, _)| (id.clone(), BTreeSet::new())).collect();
    let all: BTreeSet<(TopicId, i32)> = members.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    let wants: HashMap<&str, &BTreeSet<(TopicId, i32)>> = members.iter().map(|(id, s)| (id.as_str(), s)).collect();
    // A fair share: partitions over members, for members with a say.
    let quota = if members.is_empty() { 0 } else { all.len().div_ceil(members.len()) };
    let mut owner: HashMap<(TopicId, i32), String> = HashMap::new();
    for (id, _) in members {
        for tp in previous.get(id).into_iter().flatten() {
            if wants[id.as_str()].contains(tp) && out[id].len() < quota && !owner.contains_key(tp) {
                out.get_mut(id).expect("member").insert(*tp);
                owner.insert(*tp, id.clone());
            }
        }
    }
    for tp in &all {
        if owner.contains_key(tp) {
            continue;
        }
        let best = members.iter().filter(|(_, s)| s.contains(tp)).min_by_key(|(id, _)| (out[id].len(), id.clone())).map(|(id, _)| id.clone());
        if let Some(id) = best {
            out.get_mut(&id).expect("member").insert(*tp);
            owner.insert(*tp, id);
        }
    }
    // Even out: move a partition from the fullest member to the emptiest
    // that subscribes to it while they differ by more than one.
    for _ in 0..all.len() {
        let mut moved = false;
        let mut order: Vec<&String> = out.keys().collect();
        order.sort_by_key(|id| (std::cmp::Reverse(out[*id].len()), (*id).clone()));
        'outer: for from in order.clone() {
            for tp in out[from].iter().rev() {
                let to = members.iter().filter(|(id, s)| id != from && s.contains(tp) && out[id].len() + 1 < out[from].len()).min_by_key(|(id, _)| (out[id].len(), id.clone())).map(|(id, _)| id.clone());
                if let Some(to) = to {
                    let tp = *tp;
                    let from = from.clone();
                    out.get_mut(&from).expect("member").remove(&tp);
                    out.get_mut(&to).expect("member").insert(tp);
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    out
}

/// `range`: per topic, its partitions in contiguous ranges over the
/// members subscribed to it, in member id order.
fn range(members: &[(String, BTreeSet<(TopicId, i32)>)]) -> HashMap<String, BTreeSet<(TopicId, i32)>> {
    let mut out: HashMap<String, BTreeSet<(TopicId, i32)>> = members.iter().map(|(id, _)| (id.clone(), BTreeSet::new())).collect();
    let mut by_topic: BTreeMap<TopicId, BTreeSet<i32>> = BTreeMap::new();
    for (_, s) in members {
        for (t, p) in s {
            by_topic.entry(*t).or_default().insert(*p);
        }
    }
    for (t, parts) in by_topic {
        let subs: Vec<&String> = members.iter().filter(|(_, s)| s.contains(&(t, *parts.iter().next().expect("non-empty")))).map(|(id, _)| id).collect();
        let (n, k) = (parts.len(), subs.len());
        let mut it = parts.into_iter();
        for (i, id) in subs.into_iter().enumerate() {
            let take = n / k + usize::from(i < n % k);
            out.get_mut(id).expect("member").extend(it.by_ref().take(take).map(|p| (t, p)));
        }
    }
    out
}

#[cfg(test)]
mod tests;
