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
//! The rules are Kafka's classic coordinator (`GroupMetadataManager` and
//! `ClassicGroup` of Kafka 4), transition by transition, because clients'
//! state machines depend on the exact answers:
//!
//! - **Membership checks** ([`Group::validate_member`]) are the same for
//!   JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetCommit: a request
//!   naming an instance id is checked against the member that instance maps
//!   to (a replaced incarnation gets FENCED_INSTANCE_ID, not
//!   UNKNOWN_MEMBER_ID, so it stops instead of rejoining and fencing its
//!   successor); then the member must exist; then the generation must be
//!   the group's (ILLEGAL_GENERATION).
//! - **Joining.** New dynamic members first get an id with MEMBER_ID_REQUIRED
//!   (v4+); such pending ids hold the join phase open like members do. A
//!   known member rejoining in Stable rebalances only if it is the leader or
//!   its metadata changed; in CompletingRebalance with unchanged metadata it
//!   gets its JoinGroup answer again.
//! - **Static members** (`group.instance.id`, KIP-345) rejoining under a new
//!   member id replace their old incarnation (whose parked requests fail
//!   with FENCED_INSTANCE_ID). In Stable that costs no rebalance unless the
//!   group's protocol would change — changed metadata alone does not start
//!   one; the member gets its old assignment back (the leader with
//!   `skip_assignment`, v9+). In CompletingRebalance it rebalances (the
//!   leader may be assigning to the old id). A static member that misses a
//!   join phase stays a member; only dynamic ones are dropped.
//! - **Sync.** Every member must SyncGroup within the rebalance timeout of
//!   the join phase's end, also after the leader's sync made the group
//!   Stable; members that did not are removed and the group rebalances.
//! - **Sessions.** A member parked in a join or a sync is not expired; a new
//!   member parked in its first join is, after `new_member_join_timeout_ms`.
//! - **Commits** ([`Group::validate_commit`]): generation -1 commits while the
//!   group is Empty (a consumer managing its own assignment, or the admin
//!   client); otherwise member and generation are checked, and a commit in
//!   CompletingRebalance gets REBALANCE_IN_PROGRESS (not transactional ones).
//! - **Stores** (cluster mode, `GroupConfig::store_groups`): the leader's
//!   assignment is stored in the group's shard log before anyone gets it:
//!   the group stays CompletingRebalance, its syncs parked, until
//!   [`Group::stored`] says the store is done (Stable) or failed (the
//!   error to every parked sync, and a new rebalance). A static member
//!   back under a new id in Stable is answered once its new id is stored
//!   (if that fails, its old id is put back and the join gets the error).
//!   Becoming Empty is stored too, with nobody waiting
//!   ([`Group::take_store`] hands out what to store). A group restored
//!   from its store ([`Group::restore`]) is Stable with its members, their
//!   sessions counting from the restore.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use kafka_protocol::ResponseError as E;

use super::journal::{StoredGroup, StoredMember};

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
    /// How long a new member may wait in its first JoinGroup before it is
    /// dropped (Kafka's `group.classic.new.member.join.timeout.ms`): a
    /// client that gave up and retried leaves no defunct member behind.
    pub new_member_join_timeout_ms: i64,
    /// Cluster mode: a completed rebalance is answered only once its
    /// store ([`Group::take_store`]) is done ([`Group::stored`]).
    pub store_groups: bool,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { initial_rebalance_delay_ms: 3000, min_session_timeout_ms: 6000, max_session_timeout_ms: 1_800_000, max_size: 1000, new_member_join_timeout_ms: 300_000, store_groups: false }
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
    /// JoinGroup v9+: a returning static leader may be told to skip
    /// assigning (older versions are not told they lead).
    pub supports_skip_assignment: bool,
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

#[derive(Debug, Clone, Default)]
pub struct SyncArgs {
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    /// SyncGroup v5+: what the member believes the group's protocol is.
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
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
    /// When the member's session (or, while new, its first join) started
    /// counting.
    last_heartbeat_ms: i64,
    /// Added and not yet through a join phase.
    is_new: bool,
    join: Option<Token>,
    sync: Option<Token>,
}

impl Member {
    /// This member's metadata for `protocol`.
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(n, _)| n == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }

    /// When this member expires unless it is heard from; None while a
    /// rebalance it waits on covers it.
    fn expires_ms(&self, cfg: &GroupConfig) -> Option<i64> {
        if self.is_new {
            Some(self.last_heartbeat_ms + cfg.new_member_join_timeout_ms)
        } else if self.join.is_some() || self.sync.is_some() {
            None
        } else {
            Some(self.last_heartbeat_ms + self.session_timeout_ms as i64)
        }
    }
}

/// The first rebalance of an empty group waits `initial_rebalance_delay_ms`,
/// and again (for what is left of the rebalance timeout) each time a new
/// member came meanwhile, as Kafka does.
#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    delay_ms: i64,
    remaining_ms: i64,
    new_member_added: bool,
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
    /// were handed out, as Kafka does. Until then they hold the join phase
    /// open like members.
    pending: HashMap<String, i64>,
    /// Members that have not sent SyncGroup since the last join phase.
    pending_sync: HashSet<String>,
    statics: HashMap<String, String>,
    /// PreparingRebalance: when the join phase ends whoever has joined.
    join_deadline_ms: Option<i64>,
    /// After a join phase: when members that did not sync are removed.
    sync_deadline_ms: Option<i64>,
    /// Set while the first rebalance after Empty is being delayed.
    initial: Option<InitialDelay>,
    /// When the group last had no members (for offset expiry).
    pub empty_since_ms: i64,
    /// OffsetCommits let through so far: the cleanup pass forgets an idle
    /// group only if none came in since it looked at the group's offsets.
    pub commits: u64,
    /// What to store next (the group's state when it was asked for; a
    /// later ask replaces it), and who waits for it, until
    /// [`Group::take_store`].
    to_store: Option<(StoredGroup, Waiter)>,
    /// CompletingRebalance: the store (its number) of the leader's
    /// assignment; the syncs are answered when [`Group::stored`] says how
    /// it went.
    storing: Option<u64>,
    /// Stable: the store of a static member's new id; its join is
    /// answered when [`Group::stored`] says how it went.
    static_store: Option<StaticStore>,
}

/// Who waits for a store.
#[derive(Debug)]
enum Waiter {
    Nobody,
    /// The parked syncs of a completed join phase.
    Syncs,
    /// A static member's join under a new id.
    Static(StaticStore),
}

/// A static member's new id, stored before its join is answered; put
/// back to the old one if the store fails (Kafka's rule).
#[derive(Debug)]
struct StaticStore {
    seq: u64,
    instance: String,
    old_id: String,
    new_id: String,
    /// The old incarnation's protocols and timeouts.
    before: (Vec<(String, Bytes)>, i32, i32),
    reply: JoinResult,
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

fn join_error(token: Token, code: i16, member_id: &str) -> Reply {
    Reply::Join(token, JoinResult { error: code, generation: -1, member_id: member_id.to_owned(), ..Default::default() })
}

fn sync_error(token: Token, code: i16) -> Reply {
    Reply::Sync(token, SyncResult { error: code, ..Default::default() })
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
            pending_sync: HashSet::new(),
            statics: HashMap::new(),
            join_deadline_ms: None,
            sync_deadline_ms: None,
            initial: None,
            empty_since_ms: now_ms,
            commits: 0,
            to_store: None,
            storing: None,
            static_store: None,
        }
    }

    /// The group as its last store left it: Stable with its members (each
    /// session counting from `now_ms`), or Empty.
    pub fn restore(id: String, stored: StoredGroup, now_ms: i64) -> Group {
        let mut g = Group::new(id, now_ms);
        g.generation = stored.generation;
        g.protocol_type = stored.protocol_type;
        if stored.members.is_empty() {
            g.empty_since_ms = stored.stored_ms;
            return g;
        }
        let protocol = stored.protocol.unwrap_or_default();
        for m in stored.members {
            let protocols = vec![(protocol.clone(), m.metadata)];
            count_protocols(&mut g.protocol_counts, &protocols, true);
            if let Some(i) = &m.instance_id {
                g.statics.insert(i.clone(), m.id.clone());
            }
            let member = Member {
                id: m.id.clone(),
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols,
                assignment: m.assignment,
                last_heartbeat_ms: now_ms,
                is_new: false,
                join: None,
                sync: None,
            };
            g.members.insert(m.id, member);
        }
        g.protocol = Some(protocol);
        // A leader that is not a member (a store of our own never has
        // one) would stall the next join phase's election: pick one.
        g.leader = stored.leader.filter(|l| g.members.contains_key(l)).or_else(|| g.members.keys().next().cloned());
        g.state = State::Stable;
        g
    }

    /// The group as a store keeps it: its generation, protocol, leader and
    /// members with their assignments (none when Empty).
    fn snapshot(&self, now_ms: i64) -> StoredGroup {
        let protocol = self.protocol.clone().unwrap_or_default();
        StoredGroup {
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            stored_ms: now_ms,
            members: self
                .members
                .values()
                .map(|m| StoredMember {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    metadata: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// What to store in the group's shard log, if anything changed that a
    /// store keeps since the last call; `seq` names the store (unique per
    /// coordinator), for [`Group::stored`].
    pub fn take_store(&mut self, seq: u64) -> Option<StoredGroup> {
        let (stored, waiter) = self.to_store.take()?;
        match waiter {
            Waiter::Nobody => {}
            Waiter::Syncs => self.storing = Some(seq),
            Waiter::Static(s) => self.static_store = Some(StaticStore { seq, ..s }),
        }
        Some(stored)
    }

    /// Store `seq` is done (`Ok`) or failed with the error its waiters
    /// get. Kafka's rules. A completed join phase's assignment: if the
    /// group still waits for it, it becomes Stable and every parked sync
    /// gets its assignment; or every parked sync gets the error, the
    /// assignments are dropped and the group rebalances. A static member's
    /// new id: its join gets its answer; or the old id is put back and the
    /// join gets the error. A store the group no longer waits for (it
    /// moved on meanwhile) changes nothing.
    pub fn stored(&mut self, cfg: &GroupConfig, now: i64, seq: u64, result: Result<(), i16>) -> Vec<Reply> {
        if self.static_store.as_ref().is_some_and(|s| s.seq == seq) {
            let s = self.static_store.take().expect("checked");
            return self.static_stored(now, s, result);
        }
        if self.state != State::CompletingRebalance || self.storing != Some(seq) {
            return Vec::new();
        }
        self.storing = None;
        let generation = self.generation;
        match result {
            Ok(()) => self.to_stable(now),
            Err(code) => {
                tracing::warn!(group = %self.id, generation, code, "storing the group's assignment failed; it rebalances");
                let mut out = Vec::new();
                for m in self.members.values_mut() {
                    m.assignment = Bytes::new();
                    if let Some(t) = m.sync.take() {
                        out.push(sync_error(t, code));
                    }
                }
                out.extend(self.prepare_rebalance(cfg, now));
                out
            }
        }
    }

    fn static_stored(&mut self, now: i64, s: StaticStore, result: Result<(), i16>) -> Vec<Reply> {
        let waiting = self.state == State::Stable && self.statics.get(&s.instance) == Some(&s.new_id);
        let Some(token) = self.members.get_mut(&s.new_id).filter(|_| waiting).and_then(|m| m.join.take()) else { return Vec::new() };
        let code = match result {
            Ok(()) => return vec![Reply::Join(token, s.reply)],
            Err(code) => code,
        };
        tracing::warn!(group = %self.id, instance = %s.instance, code, "storing a static member's new id failed; the old id stays");
        let mut m = self.members.remove(&s.new_id).expect("found");
        count_protocols(&mut self.protocol_counts, &m.protocols, false);
        (m.protocols, m.session_timeout_ms, m.rebalance_timeout_ms) = s.before;
        count_protocols(&mut self.protocol_counts, &m.protocols, true);
        m.id = s.old_id.clone();
        m.last_heartbeat_ms = now;
        self.members.insert(s.old_id.clone(), m);
        self.statics.insert(s.instance, s.old_id.clone());
        if self.pending_sync.remove(&s.new_id) {
            self.pending_sync.insert(s.old_id.clone());
        }
        if self.leader.as_deref() == Some(s.new_id.as_str()) {
            self.leader = Some(s.old_id);
        }
        vec![join_error(token, code, "")]
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Answers every parked JoinGroup and SyncGroup with `code`: the group
    /// leaves this coordinator (its shard moved, cluster mode).
    pub fn release(&mut self, code: i16) -> Vec<Reply> {
        let mut out = Vec::new();
        for m in self.members.values_mut() {
            if let Some(t) = m.join.take() {
                out.push(join_error(t, code, &m.id));
            }
            if let Some(t) = m.sync.take() {
                out.push(sync_error(t, code));
            }
        }
        out
    }

    /// No members and no member ids handed out that may still come back.
    pub fn is_idle(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// Kafka's membership check: by instance id for static members (a
    /// replaced incarnation is fenced), then by member id.
    pub fn validate_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), i16> {
        if let Some(i) = instance_id {
            match self.statics.get(i) {
                None => return Err(err(E::UnknownMemberId)),
                Some(current) if current != member_id => return Err(err(E::FencedInstanceId)),
                Some(_) => {}
            }
        }
        if self.members.contains_key(member_id) {
            Ok(())
        } else {
            Err(err(E::UnknownMemberId))
        }
    }

    fn rebalance_timeout_ms(&self) -> i64 {
        self.members.values().map(|m| m.rebalance_timeout_ms as i64).max().unwrap_or(0)
    }

    /// Whether a joiner with this protocol type and these protocols fits
    /// the group (Kafka's `supportsProtocols`).
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type) && protocols.iter().any(|(n, _)| self.supported_by_all(n))
    }

    /// Kafka's `acceptJoiningMember`: the group size limit.
    fn accepts(&self, cfg: &GroupConfig, member_id: &str) -> bool {
        match self.state {
            State::Empty => true,
            State::PreparingRebalance => {
                let awaiting = self.members.values().filter(|m| m.join.is_some()).count();
                self.members.get(member_id).is_some_and(|m| m.join.is_some()) || awaiting < cfg.max_size
            }
            State::CompletingRebalance | State::Stable => self.members.contains_key(member_id) || self.members.len() < cfg.max_size,
        }
    }

    /// Handles a JoinGroup. The answer may come now or once the rebalance
    /// completes (then under `token`).
    pub fn join(&mut self, cfg: &GroupConfig, now: i64, token: Token, mut args: JoinArgs, new_member_id: impl FnOnce() -> String) -> Vec<Reply> {
        // A name listed twice counts once, with its first metadata (the
        // consumer-group protocol set of Kafka; `protocol_counts` relies on
        // each member's names being distinct).
        let mut seen = HashSet::new();
        args.protocols.retain(|(n, _)| seen.insert(n.clone()));
        tracing::debug!(group = %self.id, member = %args.member_id, state = self.state.name(), generation = self.generation, "join");
        if args.session_timeout_ms < cfg.min_session_timeout_ms || args.session_timeout_ms > cfg.max_session_timeout_ms {
            return vec![join_error(token, err(E::InvalidSessionTimeout), &args.member_id)];
        }
        if !self.accepts(cfg, &args.member_id) {
            // Kafka drops a member it turns away this way (a group over
            // its size after the limit was lowered sheds its last joiners).
            self.pending.remove(&args.member_id);
            let mut out = self.remove_member(&args.member_id);
            out.extend(self.maybe_complete_join(now));
            out.push(join_error(token, err(E::GroupMaxSizeReached), ""));
            return out;
        }
        if !self.supports(&args.protocol_type, &args.protocols) {
            let id = if args.member_id.is_empty() { String::new() } else { args.member_id.clone() };
            return vec![join_error(token, err(E::InconsistentGroupProtocol), &id)];
        }
        if args.member_id.is_empty() {
            return self.join_new(cfg, now, token, args, new_member_id);
        }
        if self.pending.remove(&args.member_id).is_some() {
            let id = args.member_id.clone();
            return self.add_member(cfg, now, token, id, args);
        }
        if let Err(code) = self.validate_member(&args.member_id, args.instance_id.as_deref()) {
            return vec![join_error(token, code, &args.member_id)];
        }
        let id = args.member_id.clone();
        let member = &self.members[&id];
        let matches = member.protocols == args.protocols;
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        match self.state {
            State::CompletingRebalance if matches => {
                // The member missed its JoinGroup answer: repeat it.
                vec![Reply::Join(token, self.join_result(&id))]
            }
            State::Stable if matches && !is_leader => {
                // A follower with nothing new: the current generation, so
                // it can SyncGroup.
                let mut r = self.join_result(&id);
                r.members.clear();
                vec![Reply::Join(token, r)]
            }
            State::Empty => vec![join_error(token, err(E::UnknownMemberId), &id)],
            _ => {
                // PreparingRebalance, a leader's rejoin in Stable (it may
                // have seen metadata change), or changed metadata.
                self.update_member(&id, token, now, args);
                self.rebalance_or_complete(cfg, now)
            }
        }
    }

    /// A JoinGroup without a member id.
    fn join_new(&mut self, cfg: &GroupConfig, now: i64, token: Token, args: JoinArgs, new_member_id: impl FnOnce() -> String) -> Vec<Reply> {
        // Ids are bounded by the group size, pending ones included, so
        // join attempts that never come back cannot grow the group.
        let returning_static = args.instance_id.as_ref().is_some_and(|i| self.statics.contains_key(i));
        if !returning_static && self.members.len() + self.pending.len() >= cfg.max_size {
            return vec![join_error(token, err(E::GroupMaxSizeReached), "")];
        }
        let id = new_member_id();
        match &args.instance_id {
            Some(instance) => match self.statics.get(instance).cloned() {
                Some(old) => self.replace_static(cfg, now, token, old, id, args),
                None => self.add_member(cfg, now, token, id, args),
            },
            None if args.require_known_member_id => {
                self.pending.insert(id.clone(), now + args.session_timeout_ms as i64);
                vec![join_error(token, err(E::MemberIdRequired), &id)]
            }
            None => self.add_member(cfg, now, token, id, args),
        }
    }

    /// A static member back under a new member id replaces its old
    /// incarnation (Kafka's `updateStaticMemberThenRebalanceOrCompleteJoin`).
    fn replace_static(&mut self, cfg: &GroupConfig, now: i64, token: Token, old: String, new_id: String, args: JoinArgs) -> Vec<Reply> {
        let instance = args.instance_id.clone().expect("static");
        let mut m = self.members.remove(&old).expect("a static mapping names a member");
        // The old incarnation is fenced: its parked requests fail.
        let mut out = Vec::new();
        if let Some(t) = m.join.take() {
            out.push(join_error(t, err(E::FencedInstanceId), &old));
        }
        if let Some(t) = m.sync.take() {
            out.push(sync_error(t, err(E::FencedInstanceId)));
        }
        let old_leader = self.leader.clone().unwrap_or_default();
        let before = (m.protocols.clone(), m.session_timeout_ms, m.rebalance_timeout_ms);
        m.id = new_id.clone();
        m.is_new = false;
        self.members.insert(new_id.clone(), m);
        self.statics.insert(instance.clone(), new_id.clone());
        if self.pending_sync.remove(&old) {
            self.pending_sync.insert(new_id.clone());
        }
        if self.leader.as_deref() == Some(old.as_str()) {
            self.leader = Some(new_id.clone());
        }
        self.update_member(&new_id, token, now, args.clone());
        match self.state {
            State::Stable => {
                if self.select_protocol() == self.protocol {
                    // Nothing to rebalance: the member gets the current
                    // generation and keeps its assignment; a leader skips
                    // assigning (v9+) or, before v9, is not told it leads.
                    let mut r = self.join_result(&new_id);
                    if args.supports_skip_assignment {
                        r.skip_assignment = self.leader.as_deref() == Some(new_id.as_str());
                    } else {
                        r.members.clear();
                        r.leader = old_leader;
                    }
                    if cfg.store_groups {
                        // Cluster mode: answered once the new id is
                        // stored (the join stays parked meanwhile).
                        let waiter = StaticStore { seq: 0, instance, old_id: old, new_id: new_id.clone(), before, reply: r };
                        self.to_store = Some((self.snapshot(now), Waiter::Static(waiter)));
                    } else {
                        self.members.get_mut(&new_id).expect("inserted").join = None;
                        out.push(Reply::Join(token, r));
                    }
                } else {
                    out.extend(self.rebalance_or_complete(cfg, now));
                }
            }
            // The leader may be assigning to the old id: start over.
            State::CompletingRebalance => out.extend(self.prepare_rebalance(cfg, now)),
            State::PreparingRebalance => out.extend(self.maybe_complete_join(now)),
            State::Empty => unreachable!("an empty group has no static members"),
        }
        out
    }

    /// Takes a rejoining member's new settings and parks its join.
    fn update_member(&mut self, id: &str, token: Token, now: i64, args: JoinArgs) {
        let m = self.members.get_mut(id).expect("member");
        count_protocols(&mut self.protocol_counts, &m.protocols, false);
        m.protocols = args.protocols;
        count_protocols(&mut self.protocol_counts, &m.protocols, true);
        m.session_timeout_ms = args.session_timeout_ms;
        m.rebalance_timeout_ms = args.rebalance_timeout_ms;
        m.last_heartbeat_ms = now;
        m.join = Some(token);
    }

    fn add_member(&mut self, cfg: &GroupConfig, now: i64, token: Token, id: String, args: JoinArgs) -> Vec<Reply> {
        if self.members.is_empty() {
            self.protocol_type = Some(args.protocol_type.clone());
        }
        if let Some(i) = &args.instance_id {
            self.statics.insert(i.clone(), id.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(id.clone());
        }
        if let Some(d) = self.initial.as_mut() {
            d.new_member_added = true;
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
                is_new: true,
                join: Some(token),
                sync: None,
            },
        );
        self.rebalance_or_complete(cfg, now)
    }

    /// Kafka's `maybePrepareRebalanceOrCompleteJoin`.
    fn rebalance_or_complete(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        if self.state == State::PreparingRebalance {
            self.maybe_complete_join(now)
        } else {
            self.prepare_rebalance(cfg, now)
        }
    }

    /// Enters PreparingRebalance: parked syncs fail with
    /// REBALANCE_IN_PROGRESS, and the join phase gets its deadline.
    fn prepare_rebalance(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        let mut out = Vec::new();
        if self.state == State::CompletingRebalance {
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(t) = m.sync.take() {
                    out.push(sync_error(t, err(E::RebalanceInProgress)));
                }
            }
        }
        self.pending_sync.clear();
        self.sync_deadline_ms = None;
        // Stores still under way answer nobody now: the joins and syncs
        // that waited for them are answered by this rebalance.
        self.storing = None;
        self.static_store = None;
        if let Some((_, w)) = self.to_store.as_mut() {
            *w = Waiter::Nobody;
        }
        let initial = self.state == State::Empty && cfg.initial_rebalance_delay_ms > 0;
        tracing::debug!(group = %self.id, from = self.state.name(), generation = self.generation, members = self.members.len(), "preparing rebalance");
        self.state = State::PreparingRebalance;
        if initial {
            let delay_ms = cfg.initial_rebalance_delay_ms;
            self.initial = Some(InitialDelay { delay_ms, remaining_ms: (self.rebalance_timeout_ms() - delay_ms).max(0), new_member_added: false });
            self.join_deadline_ms = Some(now + delay_ms);
            return out;
        }
        self.initial = None;
        self.join_deadline_ms = Some(now + self.rebalance_timeout_ms());
        out.extend(self.maybe_complete_join(now));
        out
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.join.is_some())
    }

    /// Ends the join phase if every member (and every handed-out id) has
    /// joined; the first rebalance of a group waits out its delay instead.
    fn maybe_complete_join(&mut self, now: i64) -> Vec<Reply> {
        if self.state != State::PreparingRebalance || self.initial.is_some() || !self.all_joined() {
            return Vec::new();
        }
        self.complete_join(now)
    }

    /// The join deadline passed.
    fn join_deadline(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        if let Some(d) = self.initial.as_mut() {
            if d.new_member_added && d.remaining_ms > 0 {
                // A member came during the delay: wait once more.
                let next = cfg.initial_rebalance_delay_ms.min(d.remaining_ms);
                *d = InitialDelay { delay_ms: next, remaining_ms: (d.remaining_ms - d.delay_ms).max(0), new_member_added: false };
                self.join_deadline_ms = Some(now + next);
                return Vec::new();
            }
        }
        self.complete_join(now)
    }

    fn complete_join(&mut self, now: i64) -> Vec<Reply> {
        self.initial = None;
        self.join_deadline_ms = None;
        // Dynamic members that did not rejoin in time leave the group;
        // static ones stay (they come back under their instance id).
        let gone: Vec<String> = self.members.values().filter(|m| m.join.is_none() && m.instance_id.is_none()).map(|m| m.id.clone()).collect();
        let mut out = Vec::new();
        for id in gone {
            out.extend(self.remove_member(&id));
        }
        if !self.members.is_empty() && !self.elect_joined_leader() {
            // Nobody rejoined: wait another rebalance timeout for sessions
            // to expire the silent members.
            tracing::warn!(group = %self.id, "no member rejoined before the rebalance timeout");
            self.join_deadline_ms = Some(now + self.rebalance_timeout_ms());
            return out;
        }
        self.generation += 1;
        if self.members.is_empty() {
            self.to_empty(now);
            return out;
        }
        self.protocol = self.select_protocol();
        self.state = State::CompletingRebalance;
        tracing::debug!(group = %self.id, generation = self.generation, members = self.members.len(), leader = ?self.leader, protocol = ?self.protocol, "join phase complete");
        self.sync_deadline_ms = Some(now + self.rebalance_timeout_ms());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result(&id);
            let m = self.members.get_mut(&id).expect("member");
            m.last_heartbeat_ms = now;
            m.is_new = false;
            m.assignment = Bytes::new();
            if let Some(t) = m.join.take() {
                out.push(Reply::Join(t, result));
            }
            self.pending_sync.insert(id);
        }
        out
    }

    /// Keeps the leader if it rejoined, else picks a member that did
    /// (Kafka's `maybeElectNewJoinedLeader`). False if none did.
    fn elect_joined_leader(&mut self) -> bool {
        if self.leader.as_ref().is_some_and(|l| self.members.get(l).is_some_and(|m| m.join.is_some())) {
            return true;
        }
        self.leader = self.members.values().find(|m| m.join.is_some()).map(|m| m.id.clone());
        self.leader.is_some()
    }

    fn to_empty(&mut self, now: i64) {
        self.state = State::Empty;
        self.protocol = None;
        self.leader = None;
        self.join_deadline_ms = None;
        self.sync_deadline_ms = None;
        self.pending_sync.clear();
        self.initial = None;
        self.storing = None;
        self.static_store = None;
        self.empty_since_ms = now;
        self.to_store = Some((self.snapshot(now), Waiter::Nobody));
    }

    fn member_list(&self) -> Vec<(String, Option<String>, Bytes)> {
        let p = self.protocol.clone().unwrap_or_default();
        self.members.values().map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&p))).collect()
    }

    /// The current generation as a JoinGroup answer (the leader gets the
    /// member list).
    fn join_result(&self, id: &str) -> JoinResult {
        let leader = self.leader.clone().unwrap_or_default();
        JoinResult {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            members: if leader == id { self.member_list() } else { Vec::new() },
            leader,
            member_id: id.to_owned(),
            skip_assignment: false,
        }
    }

    /// Whether every current member supports protocol `name`.
    fn supported_by_all(&self, name: &str) -> bool {
        self.protocol_counts.get(name).copied().unwrap_or(0) == self.members.len()
    }

    /// The common protocol with the most first-choice votes, as Kafka picks.
    /// Linear in the members' protocol lists.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let common: Vec<&String> = first.protocols.iter().map(|(n, _)| n).filter(|n| self.supported_by_all(n)).collect();
        let is_common: HashSet<&str> = common.iter().map(|n| n.as_str()).collect();
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

    /// Removes a member; its parked requests get UNKNOWN_MEMBER_ID (a live
    /// client then joins again).
    fn remove_member(&mut self, id: &str) -> Vec<Reply> {
        let Some(mut m) = self.members.remove(id) else { return Vec::new() };
        count_protocols(&mut self.protocol_counts, &m.protocols, false);
        if let Some(i) = &m.instance_id {
            if self.statics.get(i).map(String::as_str) == Some(id) {
                self.statics.remove(i);
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        self.pending_sync.remove(id);
        let mut out = Vec::new();
        if let Some(t) = m.join.take() {
            out.push(join_error(t, err(E::UnknownMemberId), ""));
        }
        if let Some(t) = m.sync.take() {
            out.push(sync_error(t, err(E::UnknownMemberId)));
        }
        out
    }

    /// What a group does after members left: rebalance the rest, or end the
    /// join phase they held open.
    fn after_departure(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        match self.state {
            State::Stable | State::CompletingRebalance => self.prepare_rebalance(cfg, now),
            State::PreparingRebalance => self.maybe_complete_join(now),
            State::Empty => Vec::new(),
        }
    }

    /// Handles a SyncGroup.
    pub fn sync(&mut self, cfg: &GroupConfig, now: i64, token: Token, args: SyncArgs) -> Vec<Reply> {
        if self.members.is_empty() {
            return vec![sync_error(token, err(E::UnknownMemberId))];
        }
        if let Err(code) = self.validate_member(&args.member_id, args.instance_id.as_deref()) {
            return vec![sync_error(token, code)];
        }
        if args.generation != self.generation {
            return vec![sync_error(token, err(E::IllegalGeneration))];
        }
        let inconsistent = |asked: &Option<String>, have: &Option<String>| matches!((asked, have), (Some(a), Some(h)) if a != h);
        if inconsistent(&args.protocol_type, &self.protocol_type) || inconsistent(&args.protocol_name, &self.protocol) {
            return vec![sync_error(token, err(E::InconsistentGroupProtocol))];
        }
        let id = args.member_id;
        match self.state {
            State::Empty => vec![sync_error(token, err(E::UnknownMemberId))],
            State::PreparingRebalance => vec![sync_error(token, err(E::RebalanceInProgress))],
            State::Stable => {
                self.synced(&id);
                let assignment = self.members[&id].assignment.clone();
                vec![Reply::Sync(token, self.sync_result(assignment))]
            }
            State::CompletingRebalance => {
                let mut out = Vec::new();
                let m = self.members.get_mut(&id).expect("validated");
                if let Some(earlier) = m.sync.replace(token) {
                    // A repeated SyncGroup replaces the one parked before.
                    out.push(sync_error(earlier, err(E::RebalanceInProgress)));
                }
                self.synced(&id);
                let store_asked = matches!(self.to_store, Some((_, Waiter::Syncs)));
                if self.leader.as_deref() != Some(id.as_str()) || self.storing.is_some() || store_asked {
                    // Followers wait for the leader's assignment, and a
                    // leader's repeated sync for the store its first began.
                    return out;
                }
                // The leader's assignment completes the rebalance. Entries
                // for ids that are not members are ignored, members without
                // one get an empty assignment, as Kafka does.
                let mut given: HashMap<String, Bytes> = args.assignments.into_iter().collect();
                for m in self.members.values_mut() {
                    m.assignment = given.remove(&m.id).unwrap_or_default();
                }
                if !given.is_empty() {
                    tracing::debug!(group = %self.id, ignored = given.len(), "ignoring assignments for non-members");
                }
                if cfg.store_groups {
                    self.to_store = Some((self.snapshot(now), Waiter::Syncs));
                    return out;
                }
                out.extend(self.to_stable(now));
                out
            }
        }
    }

    /// The assignment is in place: Stable, and every parked sync gets its
    /// member's.
    fn to_stable(&mut self, now: i64) -> Vec<Reply> {
        self.state = State::Stable;
        tracing::debug!(group = %self.id, generation = self.generation, "stable");
        let mut out = Vec::new();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let r = self.sync_result(self.members[&id].assignment.clone());
            let m = self.members.get_mut(&id).expect("member");
            if let Some(t) = m.sync.take() {
                m.last_heartbeat_ms = now;
                out.push(Reply::Sync(t, r));
            }
        }
        out
    }

    /// A member has synced since the join phase ended.
    fn synced(&mut self, id: &str) {
        self.pending_sync.remove(id);
        if self.pending_sync.is_empty() {
            self.sync_deadline_ms = None;
        }
    }

    fn sync_result(&self, assignment: Bytes) -> SyncResult {
        SyncResult { error: 0, protocol_type: self.protocol_type.clone(), protocol_name: self.protocol.clone(), assignment }
    }

    /// Handles a Heartbeat; returns its error code.
    pub fn heartbeat(&mut self, now: i64, generation: i32, member_id: &str, instance_id: Option<&str>) -> i16 {
        if let Err(code) = self.validate_member(member_id, instance_id) {
            return code;
        }
        if generation != self.generation {
            return err(E::IllegalGeneration);
        }
        let state = self.state;
        let m = self.members.get_mut(member_id).expect("validated");
        match state {
            State::Empty => err(E::UnknownMemberId),
            State::PreparingRebalance => {
                m.last_heartbeat_ms = now;
                err(E::RebalanceInProgress)
            }
            State::CompletingRebalance | State::Stable => {
                m.last_heartbeat_ms = now;
                0
            }
        }
    }

    /// Handles a LeaveGroup's members: a code for each, and the replies the
    /// departures release. Members named by instance id alone (an admin
    /// removing static members) leave too. The group rebalances once for
    /// the whole batch.
    pub fn leave(&mut self, cfg: &GroupConfig, now: i64, members: &[(String, Option<String>)]) -> (Vec<i16>, Vec<Reply>) {
        let mut codes = Vec::with_capacity(members.len());
        let mut out = Vec::new();
        let mut left = false;
        for (member_id, instance_id) in members {
            let code = if member_id.is_empty() {
                match instance_id.as_ref().and_then(|i| self.statics.get(i)).cloned() {
                    Some(id) => {
                        out.extend(self.remove_member(&id));
                        0
                    }
                    None => err(E::UnknownMemberId),
                }
            } else if self.pending.remove(member_id).is_some() {
                0
            } else {
                match self.validate_member(member_id, instance_id.as_deref()) {
                    Ok(()) => {
                        out.extend(self.remove_member(member_id));
                        0
                    }
                    Err(code) => code,
                }
            };
            if code == 0 {
                tracing::debug!(group = %self.id, member = %member_id, "member leaves");
                left = true;
            }
            codes.push(code);
        }
        if left {
            out.extend(self.after_departure(cfg, now));
        }
        (codes, out)
    }

    /// Expires members and phases whose time is up.
    pub fn tick(&mut self, cfg: &GroupConfig, now: i64) -> Vec<Reply> {
        let mut out = Vec::new();
        let before = self.pending.len();
        self.pending.retain(|_, expires| now < *expires);
        if self.pending.len() != before {
            // An id nobody came back with no longer holds the join phase.
            out.extend(self.maybe_complete_join(now));
        }
        let expired: Vec<String> = self.members.values().filter(|m| m.expires_ms(cfg).is_some_and(|d| now >= d)).map(|m| m.id.clone()).collect();
        if !expired.is_empty() {
            for id in expired {
                tracing::info!(group = %self.id, member = %id, "member session expired");
                out.extend(self.remove_member(&id));
            }
            out.extend(self.after_departure(cfg, now));
        }
        if self.state == State::PreparingRebalance && self.join_deadline_ms.is_some_and(|d| now >= d) {
            out.extend(self.join_deadline(cfg, now));
        }
        let syncing = matches!(self.state, State::CompletingRebalance | State::Stable);
        if syncing && self.sync_deadline_ms.is_some_and(|d| now >= d) {
            self.sync_deadline_ms = None;
            if !self.pending_sync.is_empty() {
                // Members that never synced leave; the rest start over.
                let lagging: Vec<String> = self.pending_sync.iter().cloned().collect();
                tracing::info!(group = %self.id, members = lagging.len(), "members did not sync in time");
                for id in lagging {
                    out.extend(self.remove_member(&id));
                }
                out.extend(self.prepare_rebalance(cfg, now));
            }
        }
        out
    }

    /// When [`Group::tick`] next has work.
    pub fn next_deadline(&self, cfg: &GroupConfig) -> Option<i64> {
        let sessions = self.members.values().filter_map(|m| m.expires_ms(cfg)).min();
        let pending = self.pending.values().copied().min();
        [sessions, pending, self.join_deadline_ms, self.sync_deadline_ms].into_iter().flatten().min()
    }

    /// Whether an OffsetCommit (or, `transactional`, a TxnOffsetCommit)
    /// with these ids may commit: Kafka's `validateOffsetCommit`.
    pub fn validate_commit(&self, generation: i32, member_id: &str, instance_id: Option<&str>, transactional: bool) -> Result<(), i16> {
        if generation < 0 && self.state == State::Empty {
            return Ok(()); // a consumer that manages its own assignment
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation != self.generation {
                return Err(err(E::IllegalGeneration));
            }
        } else if !transactional && self.state != State::Empty {
            return Err(err(E::UnknownMemberId));
        }
        if !transactional && self.state == State::CompletingRebalance {
            return Err(err(E::RebalanceInProgress));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
