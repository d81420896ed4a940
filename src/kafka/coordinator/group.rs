//! One consumer group's state machine, pure and deterministic: every entry
//! point takes `now_ms`, nothing here sleeps, spawns or does I/O. Requests
//! that must wait for a rebalance (JoinGroup, SyncGroup) are parked under a
//! [`Token`] and answered later through the [`Reply`] values the entry
//! points return; the coordinator task maps tokens to response channels.
//!
//! ```text
//!            join                 all joined / timeout          leader's sync
//!  Empty ───────────► Preparing ───────────────────► Completing ─────────────► Stable
//!    ▲                Rebalance ◄──────────────────  Rebalance  ◄───────────── │
//!    │                    │     join, leave, expiry      │   join, leave,       │
//!    └──── last member leaves / expires ─────────────────┴── expiry ───────────┘
//! ```
//!
//! Dead is represented by removing the group (DeleteGroups).
//!
//! Follows Kafka's classic coordinator: member ids handed out with
//! MEMBER_ID_REQUIRED (JoinGroup v4+), a leader chosen among the members,
//! the protocol every member supports with the most votes, static members
//! (`group.instance.id`) that rejoin without a rebalance, session and
//! rebalance timeouts, and an initial rebalance delay for new groups.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use kafka_protocol::ResponseError as E;

/// A parked request.
pub type Token = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl State {
    /// The name Kafka uses (ListGroups, DescribeGroups).
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// Coordinator-wide settings (Kafka's `group.*`).
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub initial_rebalance_delay_ms: i64,
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    pub max_size: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { initial_rebalance_delay_ms: 3000, min_session_timeout_ms: 6000, max_session_timeout_ms: 1_800_000, max_size: 1000 }
    }
}

#[derive(Debug, Clone)]
pub struct JoinArgs {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member first gets an id with MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct JoinResult {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only the leader gets the members: (member id, instance id, metadata).
    pub members: Vec<(String, Option<String>, Bytes)>,
    pub skip_assignment: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncResult {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Join(Token, JoinResult),
    Sync(Token, SyncResult),
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    last_heartbeat_ms: i64,
    join: Option<Token>,
    sync: Option<Token>,
}

impl Member {
    /// This member's metadata for `protocol`.
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(n, _)| n == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }
}

#[derive(Debug)]
pub struct Group {
    pub id: String,
    pub state: State,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// How many members list each protocol name (each member's names are
    /// distinct): a protocol every member supports has the full count.
    /// Kept so a join costs the joiner's list, not members × protocols.
    protocol_counts: HashMap<String, usize>,
    /// Ids handed out with MEMBER_ID_REQUIRED, not yet joined, with when
    /// they expire: one session timeout (the asking request's) after they
    /// were handed out, as Kafka does, so ids nobody comes back with do not
    /// hold the group's slots for long.
    pending: HashMap<String, i64>,
    statics: HashMap<String, String>,
    /// PreparingRebalance: when the join phase ends whoever has joined.
    join_deadline_ms: Option<i64>,
    /// CompletingRebalance: when members that did not sync are dropped.
    sync_deadline_ms: Option<i64>,
    /// A new group's join phase waits `initial_rebalance_delay_ms` for more
    /// members (extended by each joiner, up to the rebalance timeout from
    /// `join_started_ms`).
    initial_delay: bool,
    join_started_ms: i64,
    /// When the group last had no members (for offset expiry).
    pub empty_since_ms: i64,
    /// OffsetCommits let through so far: the cleanup pass forgets an idle
    /// group only if none came in since it looked at the group's offsets.
    pub commits: u64,
}

/// Adds (or, with `add` false, takes away) one member's protocol names.
fn count_protocols(counts: &mut HashMap<String, usize>, protocols: &[(String, Bytes)], add: bool) {
    for (n, _) in protocols {
        if add {
            *counts.entry(n.clone()).or_default() += 1;
        } else if let std::collections::hash_map::Entry::Occupied(mut e) = counts.entry(n.clone()) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

fn err(e: E) -> i16 {
    e.code()
}

impl Group {
    pub fn new(id: String, now_ms: i64) -> Group {
        Group {
            id,
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            protocol_counts: HashMap::new(),
            pending: HashMap::new(),
            statics: HashMap::new(),
            join_deadline_ms: None,
            sync_deadline_ms: None,
            initial_delay: false,
            join_started_ms: now_ms,
            empty_since_ms: now_ms,
            commits: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// No members and no member ids handed out that may still come back.
    pub fn is_idle(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// Handles a JoinGroup. The answer may come now or once the rebalance
    /// completes (then under `token`).
    pub fn join(&mut self, cfg: &GroupConfig, now: i64, token: Token, mut args: JoinArgs, new_member_id: impl FnOnce() -> String) -> Vec<Reply> {
        // A name listed twice counts once, with its first metadata (the
        // consumer-group protocol set of Kafka; `protocol_counts` relies on
        // each member's names being distinct).
        let mut seen = std::collections::HashSet::new();
        args.protocols.retain(|(n, _)| seen.insert(n.clone()));
        tracing::debug!(group = %self.id, member = %args.member_id, state = self.state.name(), generation = self.generation, "join");
        let fail = |code: i16, member_id: &str| vec![Reply::Join(token, JoinResult { error: code, generation: -1, member_id: member_id.to_owned(), ..Default::default() })];
        if args.session_timeout_ms < cfg.min_session_timeout_ms || args.session_timeout_ms > cfg.max_session_timeout_ms {
            return fail(err(E::InvalidSessionTimeout), &args.member_id);
        }
        if args.protocol_type.is_empty() || args.protocols.is_empty() {
            return fail(err(E::InconsistentGroupProtocol), &args.member_id);
        }
        if !self.members.is_empty() {
            let same_type = self.protocol_type.as_deref() == Some(args.protocol_type.as_str());
            let common = self.candidates_with(&args.protocols).next().is_some();
            if !same_type || !common {
                return fail(err(E::InconsistentGroupProtocol), &args.member_id);
            }
        }

        if args.member_id.is_empty() {
            // A static member coming back under a new member id.
            if let Some(instance) = &args.instance_id {
                if let Some(old) = self.statics.get(instance).cloned() {
                    return self.static_rejoin(now, token, old, args, new_member_id());
                }
            }
            if self.members.len() + self.pending.len() >= cfg.max_size {
                return fail(err(E::GroupMaxSizeReached), "");
            }
            let id = new_member_id();
            if args.require_known_member_id && args.instance_id.is_none() {
                self.pending.insert(id.clone(), now + args.session_timeout_ms as i64);
                return fail(err(E::MemberIdRequired), &id);
            }
            return self.add_member(cfg, now, token, id, args);
        }

        if self.pending.remove(&args.member_id).is_some() {
            if self.members.len() >= cfg.max_size {
                return fail(err(E::GroupMaxSizeReached), &args.member_id);
            }
            let id = args.member_id.clone();
            return self.add_member(cfg, now, token, id, args);
        }
        let Some(member) = self.members.get(&args.member_id) else {
            return fail(err(E::UnknownMemberId), &args.member_id);
        };
        if member.instance_id != args.instance_id {
            return fail(err(E::FencedInstanceId), &args.member_id);
        }
        // A known member rejoining.
        let changed = member.protocols != args.protocols;
        let is_leader = self.leader.as_deref() == Some(args.member_id.as_str());
        let id = args.member_id.clone();
        {
            let m = self.members.get_mut(&id).expect("checked");
            let old = std::mem::replace(&mut m.protocols, args.protocols);
            count_protocols(&mut self.protocol_counts, &old, false);
            count_protocols(&mut self.protocol_counts, &m.protocols, true);
            m.session_timeout_ms = args.session_timeout_ms;
            m.rebalance_timeout_ms = args.rebalance_timeout_ms;
            m.last_heartbeat_ms = now;
        }
        match self.state {
            State::Stable if !changed && !is_leader => {
                // Nothing to rebalance: answer with the current generation.
                vec![Reply::Join(token, self.join_result(&id, false))]
            }
            State::CompletingRebalance if !changed => {
                // The member missed its JoinGroup answer: repeat it.
                vec![Reply::Join(token, self.join_result(&id, true))]
            }
            State::PreparingRebalance => {
                self.park_join(&id, token);
                self.maybe_complete_join(now)
            }
            _ => {
                let mut out = self.prepare_rebalance(cfg, now);
                self.park_join(&id, token);
                out.extend(self.maybe_complete_join(now));
                out
            }
        }
    }

    fn static_rejoin(&mut self, now: i64, token: Token, old: String, args: JoinArgs, new_id: String) -> Vec<Reply> {
        let instance = args.instance_id.clone().expect("static");
        let Some(mut m) = self.members.remove(&old) else {
            self.statics.remove(&instance);
            return vec![Reply::Join(token, JoinResult { error: err(E::UnknownMemberId), generation: -1, ..Default::default() })];
        };
        // The old incarnation is fenced: its parked requests fail.
        let mut out = Vec::new();
        if let Some(t) = m.join.take() {
            out.push(Reply::Join(t, JoinResult { error: err(E::FencedInstanceId), generation: -1, member_id: old.clone(), ..Default::default() }));
        }
        if let Some(t) = m.sync.take() {
            out.push(Reply::Sync(t, SyncResult { error: err(E::FencedInstanceId), ..Default::default() }));
        }
        let changed = m.protocols != args.protocols;
        m.id = new_id.clone();
        count_protocols(&mut self.protocol_counts, &m.protocols, false);
        m.protocols = args.protocols;
        count_protocols(&mut self.protocol_counts, &m.protocols, true);
        m.session_timeout_ms = args.session_timeout_ms;
        m.rebalance_timeout_ms = args.rebalance_timeout_ms;
        m.last_heartbeat_ms = now;
        self.members.insert(new_id.clone(), m);
        self.statics.insert(instance, new_id.clone());
        if self.leader.as_deref() == Some(old.as_str()) {
            self.leader = Some(new_id.clone());
        }
        match self.state {
            State::Stable if !changed => {
                // Kafka answers a returning static member with the current
                // generation; its assignment is unchanged and it skips
                // assigning even when it is the leader.
                let mut r = self.join_result(&new_id, false);
                r.skip_assignment = self.leader.as_deref() == Some(new_id.as_str());
                if r.skip_assignment {
                    r.members = self.member_list();
                }
                out.push(Reply::Join(token, r));
            }
            State::PreparingRebalance => {
                self.park_join(&new_id, token);
                out.extend(self.maybe_complete_join(now));
            }
            _ => {
                let cfg = GroupConfig { initial_rebalance_delay_ms: 0, ..GroupConfig::default() };
                out.extend(self.prepare_rebalance(&cfg, now));
                self.park_join(&new_id, token);
                out.extend(self.maybe_complete_join(now));
            }
        }
        out
    }

    fn add_member(&mut self, cfg: &GroupConfig, now: i64, token: Token, id: String, args: JoinArgs) -> Vec<Reply> {
        if self.members.is_empty() {
            self.protocol_type = Some(args.protocol_type.clone());
        }
        if let Some(i) = &args.instance_id {
            self.statics.insert(i.clone(), id.clone());
        }
        count_protocols(&mut self.protocol_counts, &args.protocols, true);
        self.members.insert(
            id.clone(),
            Member {
                id: id.clone(),
                instance_id: args.instance_id,
                client_id: args.client_id,
                client_host: args.client_host,
                session_timeout_ms: args.session_timeout_ms,
                rebalance_timeout_ms: args.rebalance_timeout_ms,
                protocols: args.protocols,
                assignment: Bytes::new(),
                last_heartbeat_ms: now,
                join: None,
                sync: None,
            },
        );
        let mut out = Vec::new();
        if self.state != State::PreparingRebalance {
            out.extend(self.prepare_rebalance(cfg, now));
        } else if self.initial_delay {
            let limit = self.join_started_ms + self.members.values().map(|m| m.rebalance_timeout_ms as i64).max().unwrap_or(0);
            let extended = (now + cfg.initial_rebalance_delay_ms).min(limit.max(now));
            self.join_deadline_ms = Some(self.join_deadline_ms.map_or(extended, |d| d.max(extended)));
        }
        self.park_join(&id, token);
        out.extend(self.maybe_complete_join(now));
        out
    }

    fn park_join(&mut self, id: &str, token: Token) {
        if let Some(m) = self.members.get_mut(id) {
            m.join = Some(token);
        }
    }

    /// Enters PreparingRebalance: parked syncs fail with
    /// REBALANCE_IN_PROGRESS, and the join phase gets its deadline.
    fn prepare_rebalance(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        let mut out = Vec::new();
        for m in self.members.values_mut() {
            if let Some(t) = m.sync.take() {
                out.push(Reply::Sync(t, SyncResult { error: err(E::RebalanceInProgress), ..Default::default() }));
            }
        }
        let rebalance_timeout = self.members.values().map(|m| m.rebalance_timeout_ms as i64).max().unwrap_or(0);
        let deadline = if self.state == State::Empty { now + cfg.initial_rebalance_delay_ms } else { now + rebalance_timeout };
        self.join_deadline_ms = Some(deadline);
        self.join_started_ms = now;
        self.sync_deadline_ms = None;
        self.initial_delay = self.state == State::Empty && cfg.initial_rebalance_delay_ms > 0;
        tracing::debug!(group = %self.id, from = self.state.name(), generation = self.generation, members = self.members.len(), "preparing rebalance");
        self.state = State::PreparingRebalance;
        out
    }

    /// Ends the join phase if every member has joined (and any initial
    /// delay has passed).
    fn maybe_complete_join(&mut self, now: i64) -> Vec<Reply> {
        if self.state != State::PreparingRebalance {
            return Vec::new();
        }
        let all_joined = self.members.values().all(|m| m.join.is_some());
        let delay_over = !self.initial_delay || self.join_deadline_ms.is_some_and(|d| now >= d);
        if all_joined && delay_over {
            self.complete_join(now)
        } else {
            Vec::new()
        }
    }

    fn complete_join(&mut self, now: i64) -> Vec<Reply> {
        // Members that did not rejoin in time leave the group.
        let gone: Vec<String> = self.members.values().filter(|m| m.join.is_none()).map(|m| m.id.clone()).collect();
        for id in gone {
            self.remove_member(&id);
        }
        self.join_deadline_ms = None;
        self.initial_delay = false;
        self.generation += 1;
        if self.members.is_empty() {
            self.state = State::Empty;
            self.protocol = None;
            self.leader = None;
            self.empty_since_ms = now;
            return Vec::new();
        }
        self.protocol = self.select_protocol();
        if self.leader.as_ref().is_none_or(|l| !self.members.contains_key(l)) {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = State::CompletingRebalance;
        tracing::debug!(group = %self.id, generation = self.generation, members = self.members.len(), leader = ?self.leader, protocol = ?self.protocol, "join phase complete");
        let rebalance_timeout = self.members.values().map(|m| m.rebalance_timeout_ms as i64).max().unwrap_or(0);
        self.sync_deadline_ms = Some(now + rebalance_timeout);
        let ids: Vec<String> = self.members.keys().cloned().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let result = self.join_result(&id, true);
            let m = self.members.get_mut(&id).expect("member");
            m.last_heartbeat_ms = now;
            m.assignment = Bytes::new();
            if let Some(t) = m.join.take() {
                out.push(Reply::Join(t, result));
            }
        }
        out
    }

    fn member_list(&self) -> Vec<(String, Option<String>, Bytes)> {
        let p = self.protocol.clone().unwrap_or_default();
        self.members.values().map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&p))).collect()
    }

    fn join_result(&self, id: &str, with_members: bool) -> JoinResult {
        let leader = self.leader.clone().unwrap_or_default();
        JoinResult {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            members: if with_members && leader == id { self.member_list() } else { Vec::new() },
            leader,
            member_id: id.to_owned(),
            skip_assignment: false,
        }
    }

    /// Whether every current member supports protocol `name`.
    fn supported_by_all(&self, name: &str) -> bool {
        self.protocol_counts.get(name).copied().unwrap_or(0) == self.members.len()
    }

    /// Protocols of `extra` (a joiner's) every current member supports.
    fn candidates_with<'a>(&'a self, extra: &'a [(String, Bytes)]) -> impl Iterator<Item = &'a String> + 'a {
        extra.iter().map(|(n, _)| n).filter(move |n| self.supported_by_all(n))
    }

    /// The common protocol with the most first-choice votes, as Kafka picks.
    /// Linear in the members' protocol lists.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let common: Vec<&String> = first.protocols.iter().map(|(n, _)| n).filter(|n| self.supported_by_all(n)).collect();
        let is_common: std::collections::HashSet<&str> = common.iter().map(|n| n.as_str()).collect();
        let mut votes: HashMap<&str, usize> = HashMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| is_common.contains(n.as_str())) {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        // Ties go to the first member's earlier preference.
        let best = common.iter().map(|n| votes.get(n.as_str()).copied().unwrap_or(0)).max()?;
        common.into_iter().find(|n| votes.get(n.as_str()).copied().unwrap_or(0) == best).cloned()
    }

    fn remove_member(&mut self, id: &str) -> Option<Member> {
        let m = self.members.remove(id)?;
        count_protocols(&mut self.protocol_counts, &m.protocols, false);
        if let Some(i) = &m.instance_id {
            if self.statics.get(i).map(String::as_str) == Some(id) {
                self.statics.remove(i);
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        Some(m)
    }

    /// Handles a SyncGroup.
    pub fn sync(&mut self, now: i64, token: Token, generation: i32, member_id: &str, instance_id: Option<&str>, assignments: Vec<(String, Bytes)>) -> Vec<Reply> {
        let fail = |code: i16| vec![Reply::Sync(token, SyncResult { error: code, ..Default::default() })];
        let Some(m) = self.members.get(member_id) else { return fail(err(E::UnknownMemberId)) };
        if m.instance_id.as_deref() != instance_id {
            return fail(err(E::FencedInstanceId));
        }
        if generation != self.generation {
            return fail(err(E::IllegalGeneration));
        }
        match self.state {
            State::Empty => fail(err(E::UnknownMemberId)),
            State::PreparingRebalance => fail(err(E::RebalanceInProgress)),
            State::Stable => {
                let assignment = m.assignment.clone();
                vec![Reply::Sync(token, self.sync_result(assignment))]
            }
            State::CompletingRebalance => {
                let is_leader = self.leader.as_deref() == Some(member_id);
                if let Some(m) = self.members.get_mut(member_id) {
                    m.sync = Some(token);
                    m.last_heartbeat_ms = now;
                }
                if !is_leader {
                    return Vec::new();
                }
                // The leader's assignment completes the rebalance. Entries
                // for ids that are not members are ignored, as Kafka does.
                for (id, a) in assignments {
                    if let Some(m) = self.members.get_mut(&id) {
                        m.assignment = a;
                    } else {
                        tracing::debug!(group = %self.id, member = %id, "ignoring assignment for a non-member");
                    }
                }
                self.state = State::Stable;
                self.sync_deadline_ms = None;
                tracing::debug!(group = %self.id, generation = self.generation, "stable");
                let mut out = Vec::new();
                let ids: Vec<String> = self.members.keys().cloned().collect();
                for id in ids {
                    let a = self.members[&id].assignment.clone();
                    let r = self.sync_result(a);
                    if let Some(t) = self.members.get_mut(&id).and_then(|m| m.sync.take()) {
                        out.push(Reply::Sync(t, r));
                    }
                }
                out
            }
        }
    }

    fn sync_result(&self, assignment: Bytes) -> SyncResult {
        SyncResult { error: 0, protocol_type: self.protocol_type.clone(), protocol_name: self.protocol.clone(), assignment }
    }

    /// Handles a Heartbeat; returns its error code.
    pub fn heartbeat(&mut self, now: i64, generation: i32, member_id: &str, instance_id: Option<&str>) -> i16 {
        let state = self.state;
        let current = self.generation;
        let Some(m) = self.members.get_mut(member_id) else { return err(E::UnknownMemberId) };
        if m.instance_id.as_deref() != instance_id {
            return err(E::FencedInstanceId);
        }
        if generation != current {
            return err(E::IllegalGeneration);
        }
        m.last_heartbeat_ms = now;
        match state {
            State::PreparingRebalance => err(E::RebalanceInProgress),
            State::Empty => err(E::UnknownMemberId),
            State::CompletingRebalance | State::Stable => 0,
        }
    }

    /// Handles one member of a LeaveGroup; returns its error code and the
    /// replies the departure releases.
    pub fn leave(&mut self, cfg: &GroupConfig, now: i64, member_id: &str, instance_id: Option<&str>) -> (i16, Vec<Reply>) {
        let id = match (member_id.is_empty(), instance_id) {
            (true, Some(i)) => match self.statics.get(i) {
                Some(id) => id.clone(),
                None => return (err(E::UnknownMemberId), Vec::new()),
            },
            _ => member_id.to_owned(),
        };
        if self.pending.remove(&id).is_some() {
            return (0, Vec::new());
        }
        let Some(m) = self.members.get(&id) else { return (err(E::UnknownMemberId), Vec::new()) };
        if instance_id.is_some() && m.instance_id.as_deref() != instance_id {
            return (err(E::FencedInstanceId), Vec::new());
        }
        let out = self.depart(cfg, now, &id);
        (0, out)
    }

    /// Removes a member and rebalances the rest.
    fn depart(&mut self, cfg: &GroupConfig, now: i64, id: &str) -> Vec<Reply> {
        tracing::debug!(group = %self.id, member = %id, "member leaves");
        let mut out = Vec::new();
        if let Some(mut m) = self.remove_member(id) {
            if let Some(t) = m.join.take() {
                out.push(Reply::Join(t, JoinResult { error: err(E::UnknownMemberId), generation: -1, member_id: id.to_owned(), ..Default::default() }));
            }
            if let Some(t) = m.sync.take() {
                out.push(Reply::Sync(t, SyncResult { error: err(E::UnknownMemberId), ..Default::default() }));
            }
        }
        match self.state {
            State::Stable | State::CompletingRebalance => {
                if self.members.is_empty() {
                    self.to_empty(now);
                } else {
                    out.extend(self.prepare_rebalance(cfg, now));
                    out.extend(self.maybe_complete_join(now));
                }
            }
            State::PreparingRebalance => out.extend(self.maybe_complete_join(now)),
            State::Empty => {}
        }
        out
    }

    fn to_empty(&mut self, now: i64) {
        self.generation += 1;
        self.state = State::Empty;
        self.protocol = None;
        self.leader = None;
        self.join_deadline_ms = None;
        self.sync_deadline_ms = None;
        self.empty_since_ms = now;
    }

    /// Expires members and phases whose time is up.
    pub fn tick(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        let mut out = Vec::new();
        self.pending.retain(|_, expires| now < *expires);
        // Members parked in a join are waiting on us, not dead.
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join.is_none() && now - m.last_heartbeat_ms >= m.session_timeout_ms as i64)
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "member session expired");
            out.extend(self.depart(cfg, now, &id));
        }
        if self.state == State::PreparingRebalance && self.join_deadline_ms.is_some_and(|d| now >= d) {
            out.extend(self.complete_join(now));
        }
        if self.state == State::CompletingRebalance && self.sync_deadline_ms.is_some_and(|d| now >= d) {
            // The leader never sent its assignment: start over without the
            // members that did not sync.
            let lagging: Vec<String> = self.members.values().filter(|m| m.sync.is_none()).map(|m| m.id.clone()).collect();
            for id in lagging {
                out.extend(self.depart(cfg, now, &id));
            }
            if self.state == State::CompletingRebalance {
                out.extend(self.prepare_rebalance(cfg, now));
            }
        }
        out
    }

    /// When [`Group::tick`] next has work.
    pub fn next_deadline(&self) -> Option<i64> {
        let sessions = self.members.values().filter(|m| m.join.is_none()).map(|m| m.last_heartbeat_ms + m.session_timeout_ms as i64).min();
        let pending = self.pending.values().copied().min();
        [sessions, pending, self.join_deadline_ms, self.sync_deadline_ms].into_iter().flatten().min()
    }

    /// Whether an OffsetCommit with these ids may commit (Kafka's rules).
    pub fn commit_allowed(&self, generation: i32, member_id: &str, instance_id: Option<&str>) -> Result<(), i16> {
        if generation < 0 && member_id.is_empty() && self.members.is_empty() {
            return Ok(()); // a consumer that manages its own assignment
        }
        let Some(m) = self.members.get(member_id) else { return Err(err(E::UnknownMemberId)) };
        if instance_id.is_some() && m.instance_id.as_deref() != instance_id {
            return Err(err(E::FencedInstanceId));
        }
        if generation != self.generation {
            return Err(err(E::IllegalGeneration));
        }
        if self.state == State::CompletingRebalance {
            return Err(err(E::RebalanceInProgress));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(delay: i64) -> GroupConfig {
        GroupConfig { initial_rebalance_delay_ms: delay, ..GroupConfig::default() }
    }

    fn args(member: &str, instance: Option<&str>) -> JoinArgs {
        JoinArgs {
            member_id: member.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
            require_known_member_id: true,
        }
    }

    #[test]
    fn handed_out_ids_put_a_deadline_on_the_group() {
        let c = GroupConfig::default();
        let mut g = Group::new("g".into(), 0);
        assert_eq!(g.next_deadline(), None);
        let r = g.join(&c, 100, 1, args("", None), || "m1".into());
        assert_eq!(join_result(&r, 1).error, E::MemberIdRequired.code());
        // The id expires one session timeout after it was handed out, and
        // the group's timer must say so, or nothing would ever expire it.
        assert_eq!(g.next_deadline(), Some(100 + 10_000));
        assert!(!g.is_idle());
        g.tick(&c, 100 + 10_000);
        assert!(g.is_idle());
        assert_eq!(g.next_deadline(), None);
    }

    fn join_result(r: &[Reply], token: Token) -> JoinResult {
        r.iter().find_map(|x| match x { Reply::Join(t, j) if *t == token => Some(j.clone()), _ => None }).expect("join answered")
    }

    /// MEMBER_ID_REQUIRED round trip, then a single member is Stable at once
    /// with no initial delay.
    fn join_one(g: &mut Group, c: &GroupConfig, now: i64, name: &str, token: Token) -> JoinResult {
        let r = g.join(c, now, token, args("", None), || name.to_string());
        let first = join_result(&r, token);
        assert_eq!(first.error, E::MemberIdRequired.code());
        let r = g.join(c, now, token + 1, args(&first.member_id, None), || unreachable!());
        if r.is_empty() {
            return JoinResult::default();
        }
        join_result(&r, token + 1)
    }

    #[test]
    fn single_member_group_becomes_stable_without_waiting() {
        let c = cfg(0);
        let mut g = Group::new("g".into(), 0);
        let j = join_one(&mut g, &c, 0, "m1", 1);
        assert_eq!((j.error, j.generation, j.leader.as_str()), (0, 1, "m1"));
        assert_eq!(j.members.len(), 1, "the leader gets the member list");
        let r = g.sync(0, 10, 1, "m1", None, vec![("m1".into(), Bytes::from_static(b"a1"))]);
        assert_eq!(r, vec![Reply::Sync(10, SyncResult { error: 0, protocol_type: Some("consumer".into()), protocol_name: Some("range".into()), assignment: Bytes::from_static(b"a1") })]);
        assert_eq!(g.state, State::Stable);
        assert_eq!(g.heartbeat(1, 1, "m1", None), 0);
        assert_eq!(g.heartbeat(1, 0, "m1", None), E::IllegalGeneration.code());
        assert_eq!(g.heartbeat(1, 1, "nobody", None), E::UnknownMemberId.code());
    }

    #[test]
    fn initial_delay_holds_the_first_rebalance() {
        let c = cfg(3000);
        let mut g = Group::new("g".into(), 0);
        assert!(join_one(&mut g, &c, 0, "m1", 1).member_id.is_empty(), "parked during the delay");
        assert_eq!(g.next_deadline(), Some(3000));
        assert!(g.tick(&c, 2999).is_empty());
        let r = g.tick(&c, 3000);
        assert_eq!(join_result(&r, 2).generation, 1);
    }

    #[test]
    fn second_member_triggers_rebalance_and_expiry_removes_it() {
        let c = cfg(0);
        let mut g = Group::new("g".into(), 0);
        join_one(&mut g, &c, 0, "m1", 1);
        g.sync(0, 3, 1, "m1", None, vec![]);
        // m2 joins: the group prepares a rebalance; m1 learns by heartbeat.
        assert!(join_one(&mut g, &c, 100, "m2", 10).member_id.is_empty());
        assert_eq!(g.state, State::PreparingRebalance);
        assert_eq!(g.heartbeat(200, 1, "m1", None), E::RebalanceInProgress.code());
        assert_eq!(g.commit_allowed(1, "m1", None), Ok(()));
        let r = g.join(&c, 300, 20, args("m1", None), || unreachable!());
        assert_eq!(join_result(&r, 20).generation, 2);
        assert_eq!(join_result(&r, 11).generation, 2);
        assert_eq!(g.commit_allowed(2, "m1", None), Err(E::RebalanceInProgress.code()));
        let leader = g.leader.clone().unwrap();
        let other = if leader == "m1" { "m2" } else { "m1" };
        assert!(g.sync(300, 30, 2, other, None, vec![]).is_empty(), "follower waits for the leader");
        let r = g.sync(300, 31, 2, &leader, None, vec![(other.into(), Bytes::from_static(b"x")), ("ghost".into(), Bytes::from_static(b"y"))]);
        assert_eq!(r.len(), 2);
        assert_eq!(g.state, State::Stable);
        assert_eq!(g.commit_allowed(1, "m1", None), Err(E::IllegalGeneration.code()));
        // The follower stops heartbeating: it expires, the leader rebalances alone.
        g.heartbeat(9_000, 2, &leader, None);
        let r = g.tick(&c, 10_300);
        assert!(r.is_empty());
        assert_eq!(g.members.len(), 1);
        assert_eq!(g.state, State::PreparingRebalance);
    }

    #[test]
    fn static_member_rejoins_without_rebalance_and_duplicates_are_fenced() {
        let c = cfg(0);
        let mut g = Group::new("g".into(), 0);
        let r = g.join(&c, 0, 1, args("", Some("i1")), || "s1".into());
        let j = join_result(&r, 1);
        assert_eq!((j.error, j.member_id.as_str(), j.generation), (0, "s1", 1));
        g.sync(0, 2, 1, "s1", Some("i1"), vec![("s1".into(), Bytes::from_static(b"p0"))]);
        // Restart: new member id, same instance, same generation, no rebalance.
        let r = g.join(&c, 100, 3, args("", Some("i1")), || "s1b".into());
        let j = join_result(&r, 3);
        assert_eq!((j.error, j.generation), (0, 1));
        assert_eq!(g.state, State::Stable);
        assert_eq!(g.heartbeat(100, 1, "s1", Some("i1")), E::UnknownMemberId.code());
        assert_eq!(g.heartbeat(100, 1, "s1b", Some("i1")), 0);
        assert_eq!(g.heartbeat(100, 1, "s1b", Some("other")), E::FencedInstanceId.code());
    }

    #[test]
    fn bad_joins_get_kafkas_codes_and_the_size_limit_holds() {
        let c = GroupConfig { max_size: 3, ..cfg(0) };
        let mut g = Group::new("g".into(), 0);
        let mut a = args("", None);
        a.protocol_type = String::new();
        assert_eq!(join_result(&g.join(&c, 0, 1, a, || "x".into()), 1).error, E::InconsistentGroupProtocol.code());
        let mut a = args("", None);
        a.protocols.clear();
        assert_eq!(join_result(&g.join(&c, 0, 2, a, || "x".into()), 2).error, E::InconsistentGroupProtocol.code());
        let mut a = args("", None);
        a.session_timeout_ms = 1;
        assert_eq!(join_result(&g.join(&c, 0, 3, a, || "x".into()), 3).error, E::InvalidSessionTimeout.code());
        assert_eq!(join_result(&g.join(&c, 0, 4, args("who", None), || "x".into()), 4).error, E::UnknownMemberId.code());
        // Many join attempts: pending ids are bounded by the group size.
        let mut errors = HashMap::new();
        for i in 0..10_000u64 {
            let r = g.join(&c, 0, 100 + i, args("", None), || format!("m{i}"));
            *errors.entry(join_result(&r, 100 + i).error).or_insert(0) += 1;
        }
        assert_eq!(errors[&E::MemberIdRequired.code()], 3);
        assert_eq!(errors[&E::GroupMaxSizeReached.code()], 10_000 - 3);
        // Pending ids expire after the session timeout they asked with.
        g.tick(&c, args("", None).session_timeout_ms as i64 - 1);
        assert_eq!(join_result(&g.join(&c, 0, 49_999, args("", None), || "early".into()), 49_999).error, E::GroupMaxSizeReached.code());
        g.tick(&c, args("", None).session_timeout_ms as i64);
        assert_eq!(join_result(&g.join(&c, 0, 50_000, args("", None), || "late".into()), 50_000).error, E::MemberIdRequired.code());
    }
}
