//! The classic group state machine, rule by rule against Kafka 4's
//! classic coordinator.

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
        supports_skip_assignment: true,
    }
}

fn sa(generation: i32, member: &str, instance: Option<&str>, assignments: Vec<(String, Bytes)>) -> SyncArgs {
    SyncArgs { generation, member_id: member.into(), instance_id: instance.map(Into::into), protocol_type: None, protocol_name: None, assignments }
}

#[test]
fn handed_out_ids_put_a_deadline_on_the_group() {
    let c = GroupConfig::default();
    let mut g = Group::new("g".into(), 0);
    assert_eq!(g.next_deadline(&c), None);
    let r = g.join(&c, 100, 1, args("", None), || "m1".into());
    assert_eq!(join_result(&r, 1).error, E::MemberIdRequired.code());
    // The id expires one session timeout after it was handed out, and
    // the group's timer must say so, or nothing would ever expire it.
    assert_eq!(g.next_deadline(&c), Some(100 + 10_000));
    assert!(!g.is_idle());
    g.tick(&c, 100 + 10_000);
    assert!(g.is_idle());
    assert_eq!(g.next_deadline(&c), None);
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
    let r = g.sync(&GroupConfig::default(), 0, 10, sa(1, "m1", None, vec![("m1".into(), Bytes::from_static(b"a1"))]));
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
    assert_eq!(g.next_deadline(&c), Some(3000));
    assert!(g.tick(&c, 2999).is_empty());
    let r = g.tick(&c, 3000);
    assert_eq!(join_result(&r, 2).generation, 1);
}

#[test]
fn second_member_triggers_rebalance_and_expiry_removes_it() {
    let c = cfg(0);
    let mut g = Group::new("g".into(), 0);
    join_one(&mut g, &c, 0, "m1", 1);
    g.sync(&GroupConfig::default(), 0, 3, sa(1, "m1", None, vec![]));
    // m2 joins: the group prepares a rebalance; m1 learns by heartbeat.
    assert!(join_one(&mut g, &c, 100, "m2", 10).member_id.is_empty());
    assert_eq!(g.state, State::PreparingRebalance);
    assert_eq!(g.heartbeat(200, 1, "m1", None), E::RebalanceInProgress.code());
    assert_eq!(g.validate_commit(1, "m1", None, false), Ok(()));
    let r = g.join(&c, 300, 20, args("m1", None), || unreachable!());
    assert_eq!(join_result(&r, 20).generation, 2);
    assert_eq!(join_result(&r, 11).generation, 2);
    assert_eq!(g.validate_commit(2, "m1", None, false), Err(E::RebalanceInProgress.code()));
    let leader = g.leader.clone().unwrap();
    let other = if leader == "m1" { "m2" } else { "m1" };
    assert!(g.sync(&GroupConfig::default(), 300, 30, sa(2, other, None, vec![])).is_empty(), "follower waits for the leader");
    let r = g.sync(&GroupConfig::default(), 300, 31, sa(2, &leader, None, vec![(other.into(), Bytes::from_static(b"x")), ("ghost".into(), Bytes::from_static(b"y"))]));
    assert_eq!(r.len(), 2);
    assert_eq!(g.state, State::Stable);
    assert_eq!(g.validate_commit(1, "m1", None, false), Err(E::IllegalGeneration.code()));
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
    g.sync(&GroupConfig::default(), 0, 2, sa(1, "s1", Some("i1"), vec![("s1".into(), Bytes::from_static(b"p0"))]));
    // Restart: new member id, same instance, same generation, no rebalance.
    let r = g.join(&c, 100, 3, args("", Some("i1")), || "s1b".into());
    let j = join_result(&r, 3);
    assert_eq!((j.error, j.generation), (0, 1));
    assert_eq!(g.state, State::Stable);
    // The old incarnation is fenced (it must stop, not rejoin and fence
    // its successor in turn).
    assert_eq!(g.heartbeat(100, 1, "s1", Some("i1")), E::FencedInstanceId.code());
    assert_eq!(g.heartbeat(100, 1, "s1b", Some("i1")), 0);
    // An instance id the group does not know: an unknown member.
    assert_eq!(g.heartbeat(100, 1, "s1b", Some("other")), E::UnknownMemberId.code());
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

// ---- Kafka's classic rules, one test per rule ----

/// A test group: tokens and member ids handed out in order, time set
/// by the test.
struct Harness {
    g: Group,
    c: GroupConfig,
    now: i64,
    token: Token,
    ids: u32,
}

impl Harness {
    fn new() -> Harness {
        Harness { g: Group::new("g".into(), 0), c: cfg(0), now: 0, token: 0, ids: 0 }
    }

    fn token(&mut self) -> Token {
        self.token += 1;
        self.token
    }

    fn join(&mut self, a: JoinArgs) -> (Token, Vec<Reply>) {
        let t = self.token();
        self.ids += 1;
        let fresh = format!("m{}", self.ids);
        (t, self.g.join(&self.c, self.now, t, a, || fresh))
    }

    /// A dynamic member's full entry: MEMBER_ID_REQUIRED, then the
    /// join proper (parked or answered).
    fn join_dynamic(&mut self, protocols: &[(&str, &'static [u8])]) -> (String, Token, Vec<Reply>) {
        let (t, r) = self.join(with(args("", None), protocols));
        let id = join_result(&r, t).member_id;
        let (t, r) = self.join(with(args(&id, None), protocols));
        (id, t, r)
    }

    fn sync(&mut self, member: &str, instance: Option<&str>, assignments: Vec<(String, Bytes)>) -> (Token, Vec<Reply>) {
        let t = self.token();
        let generation = self.g.generation;
        (t, self.g.sync(&self.c, self.now, t, sa(generation, member, instance, assignments)))
    }

    /// Syncs every member, the leader last, assigning each its own id.
    fn sync_all(&mut self) -> Vec<Reply> {
        let leader = self.g.leader.clone().unwrap();
        let ids: Vec<(String, Option<String>)> = self.g.members.values().map(|m| (m.id.clone(), m.instance_id.clone())).collect();
        let mut out = Vec::new();
        for (id, i) in ids.iter().filter(|(id, _)| *id != leader) {
            out.extend(self.sync(id, i.as_deref(), vec![]).1);
        }
        let i = self.g.members[&leader].instance_id.clone();
        let assignments = ids.iter().map(|(id, _)| (id.clone(), Bytes::from(id.clone()))).collect();
        out.extend(self.sync(&leader, i.as_deref(), assignments).1);
        assert_eq!(self.g.state, State::Stable);
        out
    }

    fn tick(&mut self, now: i64) -> Vec<Reply> {
        self.now = now;
        self.g.tick(&self.c, now)
    }
}

fn with(mut a: JoinArgs, protocols: &[(&str, &'static [u8])]) -> JoinArgs {
    if !protocols.is_empty() {
        a.protocols = protocols.iter().map(|(n, m)| (n.to_string(), Bytes::from_static(m))).collect();
    }
    a
}

fn sync_result(r: &[Reply], token: Token) -> SyncResult {
    r.iter().find_map(|x| match x { Reply::Sync(t, s) if *t == token => Some(s.clone()), _ => None }).expect("sync answered")
}

/// Two static members, Stable at generation 1.
fn two_statics(h: &mut Harness) -> (String, String) {
    // Both arrive within the initial delay (static members get their
    // ids at once, no MEMBER_ID_REQUIRED).
    h.c.initial_rebalance_delay_ms = 100;
    let (t1, r1) = h.join(args("", Some("i1")));
    let (t2, r2) = h.join(args("", Some("i2")));
    assert!(r1.is_empty() && r2.is_empty(), "parked for the delay");
    // The second came during the delay: it runs once more.
    assert!(h.tick(100).is_empty());
    let r = h.tick(200);
    assert_eq!((join_result(&r, t1).generation, join_result(&r, t2).generation), (1, 1));
    let a = h.g.statics["i1"].clone();
    let b = h.g.statics["i2"].clone();
    h.sync_all();
    (a, b)
}

#[test]
fn a_replaced_static_incarnation_is_fenced_everywhere() {
    let mut h = Harness::new();
    let (a, _) = two_statics(&mut h);
    let gen = h.g.generation;
    let (t, r) = h.join(args("", Some("i1")));
    let fresh = join_result(&r, t).member_id;
    assert_ne!(fresh, a);
    let fenced = E::FencedInstanceId.code();
    assert_eq!(h.g.heartbeat(h.now, gen, &a, Some("i1")), fenced);
    assert_eq!(h.g.validate_commit(gen, &a, Some("i1"), false), Err(fenced));
    assert_eq!(sync_result(&h.g.sync(&h.c, h.now, 99, sa(gen, &a, Some("i1"), vec![])), 99).error, fenced);
    let (t, r) = h.join(args(&a, Some("i1")));
    assert_eq!(join_result(&r, t).error, fenced);
    let (codes, _) = h.g.leave(&h.c, h.now, &[(a.clone(), Some("i1".into()))]);
    assert_eq!(codes, vec![fenced]);
    // An instance id the group does not know is an unknown member.
    assert_eq!(h.g.heartbeat(h.now, gen, &fresh, Some("nobody")), E::UnknownMemberId.code());
    // The new incarnation is fine, and nothing rebalanced.
    assert_eq!(h.g.heartbeat(h.now, gen, &fresh, Some("i1")), 0);
    assert_eq!((h.g.state, h.g.generation), (State::Stable, gen));
}

#[test]
fn a_static_rejoin_in_stable_with_new_metadata_costs_no_rebalance() {
    let mut h = Harness::new();
    let (a, b) = two_statics(&mut h);
    let gen = h.g.generation;
    let follower = if h.g.leader.as_deref() == Some(a.as_str()) { ("i2", b.clone()) } else { ("i1", a.clone()) };
    // Restarted with different user data (owned partitions, say), same
    // protocol: Kafka hands back the current generation.
    let (t, r) = h.join(with(args("", Some(follower.0)), &[("range", b"new metadata")]));
    let j = join_result(&r, t);
    assert_eq!((j.error, j.generation, j.skip_assignment), (0, gen, false));
    assert!(j.members.is_empty(), "a follower gets no member list");
    assert_eq!(h.g.state, State::Stable);
    let other = if follower.1 == a { (&b, "i2") } else { (&a, "i1") };
    assert_eq!(h.g.heartbeat(h.now, gen, other.0, Some(other.1)), 0, "the other member sees no rebalance");
    // It keeps its assignment under the new id.
    let (t, r) = h.sync(&j.member_id, Some(follower.0), vec![]);
    assert_eq!(sync_result(&r, t).assignment, Bytes::from(follower.1.clone()));
    // A protocol the others do not support would change the group's
    // protocol: that one rebalances (here it is refused outright, as no
    // common protocol would be left).
    let (t, r) = h.join(with(args("", Some(follower.0)), &[("roundrobin", b"")]));
    assert_eq!(join_result(&r, t).error, E::InconsistentGroupProtocol.code());
}

#[test]
fn a_static_rejoin_that_changes_the_groups_protocol_rebalances() {
    let mut h = Harness::new();
    h.c.initial_rebalance_delay_ms = 100;
    let both: &[(&str, &'static [u8])] = &[("range", b""), ("sticky", b"")];
    let (_, _) = h.join(with(args("", Some("i1")), both));
    let (_, _) = h.join(with(args("", Some("i2")), &[("sticky", b""), ("range", b"")]));
    h.tick(100);
    h.tick(200);
    h.sync_all();
    assert_eq!(h.g.protocol.as_deref(), Some("range"), "a tie goes to the first member's preference");
    let gen = h.g.generation;
    // i2 comes back preferring only sticky: the vote becomes sticky.
    let (t, r) = h.join(with(args("", Some("i2")), &[("sticky", b"")]));
    assert!(r.iter().all(|x| !matches!(x, Reply::Join(tt, _) if *tt == t)), "parked for a rebalance");
    assert_eq!(h.g.state, State::PreparingRebalance);
    let a = h.g.statics["i1"].clone();
    assert_eq!(h.g.heartbeat(h.now, gen, &a, Some("i1")), E::RebalanceInProgress.code());
}

#[test]
fn a_returning_static_leader_skips_assignment_from_v9_and_is_not_told_it_leads_before() {
    let mut h = Harness::new();
    let (a, b) = two_statics(&mut h);
    let gen = h.g.generation;
    let leader = h.g.leader.clone().unwrap();
    let instance = if leader == a { "i1" } else { "i2" };
    let _ = b;
    let (t, r) = h.join(args("", Some(instance)));
    let j = join_result(&r, t);
    assert_eq!((j.generation, j.skip_assignment, j.leader.as_str()), (gen, true, j.member_id.as_str()));
    assert_eq!(j.members.len(), 2, "v9: the leader gets the members to keep its view");
    let mut old = args("", Some(instance));
    old.supports_skip_assignment = false;
    let (t, r) = h.join(old);
    let j2 = join_result(&r, t);
    assert_eq!((j2.generation, j2.skip_assignment), (gen, false));
    assert!(j2.members.is_empty());
    assert_eq!(j2.leader, j.member_id, "the leader id from before the replacement");
    assert_eq!(h.g.state, State::Stable);
}

#[test]
fn a_static_rejoin_while_completing_restarts_the_rebalance_and_fences_the_parked_sync() {
    let mut h = Harness::new();
    let (a, b) = two_statics(&mut h);
    // The leader rejoins: a new join phase; both rejoin.
    let leader = h.g.leader.clone().unwrap();
    let (li, fi, follower) = if leader == a { ("i1", "i2", b.clone()) } else { ("i2", "i1", a.clone()) };
    let (_, _) = h.join(args(&leader, Some(li)));
    let (tf, r) = h.join(args(&follower, Some(fi)));
    assert_eq!(join_result(&r, tf).generation, 2);
    assert_eq!(h.g.state, State::CompletingRebalance);
    let (ts, r) = h.sync(&follower, Some(fi), vec![]);
    assert!(r.is_empty(), "the follower waits for the leader");
    // The follower restarts (new member id) before the leader assigns.
    let (t, r) = h.join(args("", Some(fi)));
    assert_eq!(sync_result(&r, ts).error, E::FencedInstanceId.code());
    assert!(r.iter().all(|x| !matches!(x, Reply::Join(tt, _) if *tt == t)));
    assert_eq!(h.g.state, State::PreparingRebalance);
}

#[test]
fn a_static_rejoin_while_preparing_waits_with_the_others_and_fences_the_parked_join() {
    let mut h = Harness::new();
    let (a, b) = two_statics(&mut h);
    let leader = h.g.leader.clone().unwrap();
    let (li, fi) = if leader == a { ("i1", "i2") } else { ("i2", "i1") };
    let _ = b;
    // A dynamic third member makes the join phases wait for it.
    let (d, _, _) = h.join_dynamic(&[]);
    let (_, _) = h.join(args(&leader, Some(li)));
    let follower = h.g.statics[fi].clone();
    let (_, r) = h.join(args(&follower, Some(fi)));
    assert!(r.len() == 3 && h.g.state == State::CompletingRebalance);
    h.sync_all();
    let gen = h.g.generation;
    // The leader rejoins; the follower restarts twice while the group
    // waits for the dynamic member.
    let (_, _) = h.join(args(&leader, Some(li)));
    let (t1, r) = h.join(args("", Some(fi)));
    assert!(r.is_empty(), "parked with the others");
    let (t2, r) = h.join(args("", Some(fi)));
    assert_eq!(join_result(&r, t1).error, E::FencedInstanceId.code(), "the first restart's parked join is fenced");
    assert_eq!(h.g.state, State::PreparingRebalance);
    let (td, r) = h.join(args(&d, None));
    assert_eq!(join_result(&r, t2).generation, gen + 1, "the newest incarnation is in the new generation");
    assert_eq!(join_result(&r, td).generation, gen + 1);
    assert_eq!(h.g.members.len(), 3);
}

#[test]
fn known_members_rejoining_rebalance_only_when_kafka_would() {
    let mut h = Harness::new();
    let (m1, _, _) = h.join_dynamic(&[]);
    assert_eq!(h.g.state, State::CompletingRebalance);
    h.sync_all();
    let (m2, t2, _) = h.join_dynamic(&[]);
    let (t1, r) = h.join(args(&m1, None));
    assert_eq!(join_result(&r, t2).generation, 2);
    assert_eq!(join_result(&r, t1).generation, 2);
    // CompletingRebalance, unchanged metadata: the answer again (the
    // leader with the member list), no new phase.
    let leader = h.g.leader.clone().unwrap();
    let follower = if leader == m1 { m2.clone() } else { m1.clone() };
    let (t, r) = h.join(args(&leader, None));
    let j = join_result(&r, t);
    assert_eq!((j.generation, j.members.len()), (2, 2));
    assert_eq!(h.g.state, State::CompletingRebalance);
    h.sync_all();
    // Stable: a follower with the same metadata gets the generation.
    let (t, r) = h.join(args(&follower, None));
    assert_eq!((join_result(&r, t).generation, h.g.state), (2, State::Stable));
    // Stable: a follower with new metadata starts a rebalance.
    let (t, r) = h.join(with(args(&follower, None), &[("range", b"other")]));
    assert!(r.iter().all(|x| !matches!(x, Reply::Join(tt, _) if *tt == t)));
    assert_eq!(h.g.state, State::PreparingRebalance);
    let (_, _) = h.join(args(&leader, None));
    h.sync_all();
    // Stable: the leader rejoining, unchanged, starts one too (topic
    // metadata may have changed under it).
    let (_, r) = h.join(args(&leader, None));
    assert!(r.is_empty());
    assert_eq!(h.g.state, State::PreparingRebalance);
}

#[test]
fn a_commit_from_a_replaced_generation_is_illegal() {
    let mut h = Harness::new();
    let (m1, _, _) = h.join_dynamic(&[]);
    h.sync_all();
    assert_eq!(h.g.validate_commit(1, &m1, None, false), Ok(()));
    // A second member: the rebalance is in preparation; generation 1
    // may still commit (revoking consumers commit here).
    let (_m2, _, _) = h.join_dynamic(&[]);
    assert_eq!(h.g.validate_commit(1, &m1, None, false), Ok(()));
    let (_, _) = h.join(args(&m1, None));
    // Completing: the generation is new but assignments are not out.
    assert_eq!(h.g.validate_commit(2, &m1, None, false), Err(E::RebalanceInProgress.code()));
    assert_eq!(h.g.validate_commit(2, &m1, None, true), Ok(()), "transactional commits are not held");
    assert_eq!(h.g.validate_commit(1, &m1, None, false), Err(E::IllegalGeneration.code()));
    h.sync_all();
    // The rebalance is complete: the old generation is refused.
    assert_eq!(h.g.validate_commit(1, &m1, None, false), Err(E::IllegalGeneration.code()));
    assert_eq!(h.g.validate_commit(2, &m1, None, false), Ok(()));
    assert_eq!(h.g.validate_commit(2, "stranger", None, false), Err(E::UnknownMemberId.code()));
    // No member details: only while the group is Empty (or for a
    // transaction).
    assert_eq!(h.g.validate_commit(-1, "", None, false), Err(E::UnknownMemberId.code()));
    assert_eq!(h.g.validate_commit(-1, "", None, true), Ok(()));
    let (codes, _) = h.g.leave(&h.c, h.now, &[(m1.clone(), None), (_m2.clone(), None)]);
    assert_eq!(codes, vec![0, 0]);
    assert_eq!(h.g.state, State::Empty);
    assert_eq!(h.g.validate_commit(-1, "", None, false), Ok(()));
    assert_eq!(h.g.validate_commit(-1, &m1, None, false), Ok(()), "generation -1 in an Empty group, whatever the id");
    assert_eq!(h.g.validate_commit(2, &m1, None, false), Err(E::UnknownMemberId.code()));
}

#[test]
fn members_that_never_sync_are_removed_even_after_the_leader_made_the_group_stable() {
    let mut h = Harness::new();
    let (m1, _, _) = h.join_dynamic(&[]);
    h.sync_all();
    let (m2, t2, _) = h.join_dynamic(&[]);
    let (t1, r) = h.join(args(&m1, None));
    assert_eq!(join_result(&r, t1).generation, 2);
    let _ = t2;
    let leader = h.g.leader.clone().unwrap();
    let follower = if leader == m1 { m2.clone() } else { m1.clone() };
    let (_, _) = h.sync(&leader, None, vec![]);
    assert_eq!(h.g.state, State::Stable);
    // The follower heartbeats but never syncs: after the rebalance
    // timeout (30 s) it is dropped and the group rebalances.
    for s in 1..=5 {
        assert_eq!(h.g.heartbeat(s * 5_000, 2, &follower, None), 0);
        assert_eq!(h.g.heartbeat(s * 5_000, 2, &leader, None), 0);
    }
    assert_eq!(h.g.next_deadline(&h.c), Some(30_000));
    h.tick(30_000);
    assert!(!h.g.members.contains_key(&follower));
    assert_eq!(h.g.state, State::PreparingRebalance);
}

#[test]
fn a_static_member_that_misses_a_join_phase_stays_and_a_dynamic_one_goes() {
    let mut h = Harness::new();
    h.c.initial_rebalance_delay_ms = 100;
    let (_, _) = h.join(args("", Some("i1")));
    let (d, _, _) = h.join_dynamic(&[]);
    h.tick(100);
    h.tick(200);
    h.sync_all();
    let s = h.g.statics["i1"].clone();
    let gen = h.g.generation;
    // A third member joins; nobody else rejoins within the rebalance
    // timeout.
    let (x, tx, _) = h.join_dynamic(&[]);
    for step in 1..=6 {
        // Heartbeats keep both sessions alive; they learn of the
        // rebalance but do not rejoin.
        assert_eq!(h.g.heartbeat(step * 5_000, gen, &s, Some("i1")), E::RebalanceInProgress.code());
        assert_eq!(h.g.heartbeat(step * 5_000, gen, &d, None), E::RebalanceInProgress.code());
    }
    let r = h.tick(200 + 30_000);
    let j = join_result(&r, tx);
    assert_eq!(j.generation, gen + 1);
    assert!(h.g.members.contains_key(&s), "the static member stays");
    assert!(!h.g.members.contains_key(&d), "the dynamic member is dropped");
    assert_eq!(j.leader, x, "the leader is a member that joined");
}

#[test]
fn handed_out_ids_hold_the_join_phase_open() {
    let mut h = Harness::new();
    let (m1, _, _) = h.join_dynamic(&[]);
    h.sync_all();
    // A new member got its id but has not joined with it yet.
    let (t, r) = h.join(args("", None));
    assert_eq!(join_result(&r, t).error, E::MemberIdRequired.code());
    // The leader rejoins (a new phase); the handed-out id may still
    // come, so the phase waits for it until it expires (its session
    // timeout), then ends without it.
    let (t1, r) = h.join(args(&m1, None));
    assert!(r.is_empty());
    assert!(h.tick(9_999).is_empty());
    let r = h.tick(10_000);
    assert_eq!(join_result(&r, t1).generation, 2);
}

#[test]
fn parked_members_do_not_expire_but_new_members_stuck_in_a_join_do() {
    let mut h = Harness::new();
    h.c.initial_rebalance_delay_ms = 0;
    let (m1, _, _) = h.join_dynamic(&[]);
    h.sync_all();
    let (m2, _, _) = h.join_dynamic(&[]);
    let (_, _) = h.join(args(&m1, None));
    let leader = h.g.leader.clone().unwrap();
    let follower = if leader == m1 { m2.clone() } else { m1.clone() };
    // The follower parks its sync; the leader is slow to assign but
    // within the rebalance timeout. The follower's session (10 s) must
    // not run out while it waits on us.
    let (ts, r) = h.sync(&follower, None, vec![]);
    assert!(r.is_empty());
    h.g.heartbeat(20_000, 2, &leader, None);
    assert!(h.tick(20_000).is_empty());
    assert!(h.g.members.contains_key(&follower));
    let (_, r) = h.sync(&leader, None, vec![]);
    assert_eq!(sync_result(&r, ts).error, 0);
    // A new member parks in a join the others never rejoin: it is
    // dropped at the new-member timeout (here shorter than the
    // rebalance timeout), so a client that gave up leaves nothing.
    let mut h = Harness::new();
    h.c.new_member_join_timeout_ms = 5_000;
    let (m1, _, _) = h.join_dynamic(&[]);
    h.sync_all();
    let (_, t, _) = h.join_dynamic(&[]);
    h.g.heartbeat(4_000, 1, &m1, None);
    let r = h.tick(5_000);
    assert_eq!(join_result(&r, t).error, E::UnknownMemberId.code());
    assert_eq!(h.g.members.len(), 1);
}

#[test]
fn a_batch_leave_rebalances_once_and_names_members_by_instance() {
    let mut h = Harness::new();
    let (a, b) = two_statics(&mut h);
    let (d, _, _) = h.join_dynamic(&[]);
    let (t, r) = h.join(args("", None));
    let pending = join_result(&r, t).member_id;
    let _ = (a, b, d);
    let (codes, _) = h.g.leave(&h.c, h.now, &[("".into(), Some("i1".into())), (pending, None), ("".into(), Some("nobody".into())), ("ghost".into(), None)]);
    assert_eq!(codes, vec![0, 0, E::UnknownMemberId.code(), E::UnknownMemberId.code()]);
    assert!(!h.g.statics.contains_key("i1"));
    assert_eq!(h.g.state, State::PreparingRebalance);
}

#[test]
fn a_sync_naming_another_protocol_changes_nothing() {
    let mut h = Harness::new();
    let (m1, _, _) = h.join_dynamic(&[]);
    let t = h.token();
    let mut s = sa(1, &m1, None, vec![(m1.clone(), Bytes::from_static(b"x"))]);
    s.protocol_name = Some("roundrobin".into());
    let r = h.g.sync(&h.c, 0, t, s);
    assert_eq!(sync_result(&r, t).error, E::InconsistentGroupProtocol.code());
    assert_eq!(h.g.state, State::CompletingRebalance, "the leader's assignment was not taken");
    let t = h.token();
    let mut s = sa(1, &m1, None, vec![]);
    s.protocol_type = Some("connect".into());
    assert_eq!(sync_result(&h.g.sync(&h.c, 0, t, s), t).error, E::InconsistentGroupProtocol.code());
    // The right names (or none, before v5) are fine.
    let t = h.token();
    let mut s = sa(1, &m1, None, vec![]);
    s.protocol_type = Some("consumer".into());
    s.protocol_name = Some("range".into());
    assert_eq!(sync_result(&h.g.sync(&h.c, 0, t, s), t).error, 0);
}

#[test]
fn the_initial_delay_extends_while_members_arrive_up_to_the_rebalance_timeout() {
    let mut h = Harness::new();
    h.c.initial_rebalance_delay_ms = 3000;
    let (_, t1, _) = h.join_dynamic(&[]);
    assert_eq!(h.g.next_deadline(&h.c), Some(3000));
    h.now = 2000;
    let (_, _, _) = h.join_dynamic(&[]);
    // At 3000 a member had come: wait another 3000.
    assert!(h.tick(3000).is_empty());
    assert_eq!(h.g.next_deadline(&h.c), Some(6000));
    let r = h.tick(6000);
    assert_eq!(join_result(&r, t1).generation, 1);
    // Members arriving forever cannot hold it past the rebalance
    // timeout (30 s).
    let mut h = Harness::new();
    h.c.initial_rebalance_delay_ms = 3000;
    let (_, t1, _) = h.join_dynamic(&[]);
    let mut at = 0;
    loop {
        at += 1000;
        h.now = at;
        let (_, _, r) = h.join_dynamic(&[]);
        let mut r = r;
        r.extend(h.tick(at));
        if r.iter().any(|x| matches!(x, Reply::Join(t, _) if *t == t1)) {
            break;
        }
        assert!(at <= 30_000, "still delayed at {at} ms");
    }
}

// ---- Stores (cluster mode): a rebalance is answered once it is stored ----

/// Two dynamic members joined (generation 1, CompletingRebalance), with
/// stores on.
fn two_joined_storing() -> (Harness, String, String) {
    let mut h = Harness::new();
    h.c.store_groups = true;
    let (a, _, _) = h.join_dynamic(&[]);
    // The second member's arrival starts a join phase that waits for the
    // first to rejoin.
    let (b, _, _) = h.join_dynamic(&[]);
    h.join(args(&a, None));
    assert!(h.g.members.contains_key(&b));
    assert_eq!(h.g.state, State::CompletingRebalance, "{:?}", h.g.state);
    let leader = h.g.leader.clone().unwrap();
    let follower = if leader == a { b } else { a };
    (h, leader, follower)
}

#[test]
fn a_stored_rebalance_is_answered_only_once_its_store_is_done() {
    let (mut h, leader, follower) = two_joined_storing();
    let gen = h.g.generation;
    let (tf, r) = h.sync(&follower, None, vec![]);
    assert!(r.is_empty(), "the follower waits for the leader");
    let assignments = vec![(leader.clone(), Bytes::from_static(b"to-leader")), (follower.clone(), Bytes::from_static(b"to-follower"))];
    let (tl, r) = h.sync(&leader, None, assignments);
    assert!(r.is_empty(), "nobody is answered before the store: {r:?}");
    assert_eq!(h.g.state, State::CompletingRebalance);
    // What is to be stored: the generation with every member's assignment.
    let s = h.g.take_store(5).expect("a store asked for");
    assert!(h.g.take_store(6).is_none(), "handed out once");
    assert_eq!((s.generation, s.protocol.as_deref(), s.leader.as_deref()), (gen, Some("range"), Some(leader.as_str())));
    let given: BTreeMap<String, Bytes> = s.members.iter().map(|m| (m.id.clone(), m.assignment.clone())).collect();
    assert_eq!(given[&follower], Bytes::from_static(b"to-follower"));
    assert_eq!(s.members[0].metadata, Bytes::from_static(b"m"), "the chosen protocol's metadata");
    // A leader's repeated sync during the store starts no second one.
    let (tl2, r) = h.sync(&leader, None, vec![]);
    assert_eq!(sync_result(&r, tl).error, E::RebalanceInProgress.code(), "the earlier sync is replaced");
    assert!(h.g.take_store(7).is_none());
    // Another store's result changes nothing.
    assert!(h.g.stored(&h.c, h.now, 4, Ok(())).is_empty());
    assert_eq!(h.g.state, State::CompletingRebalance);
    let r = h.g.stored(&h.c, h.now, 5, Ok(()));
    assert_eq!(h.g.state, State::Stable);
    assert_eq!(sync_result(&r, tf).assignment, Bytes::from_static(b"to-follower"));
    assert_eq!(sync_result(&r, tl2).assignment, Bytes::from_static(b"to-leader"));
    // Late news of it again is ignored.
    assert!(h.g.stored(&h.c, h.now, 5, Err(E::NotCoordinator.code())).is_empty());
    assert_eq!(h.g.state, State::Stable);
}

#[test]
fn a_failed_store_fails_every_parked_sync_and_rebalances() {
    let (mut h, leader, follower) = two_joined_storing();
    let (tf, _) = h.sync(&follower, None, vec![]);
    let (tl, _) = h.sync(&leader, None, vec![(follower.clone(), Bytes::from_static(b"x"))]);
    assert!(h.g.take_store(1).is_some());
    let r = h.g.stored(&h.c, h.now, 1, Err(E::CoordinatorNotAvailable.code()));
    assert_eq!(sync_result(&r, tf).error, E::CoordinatorNotAvailable.code());
    assert_eq!(sync_result(&r, tl).error, E::CoordinatorNotAvailable.code());
    assert_eq!(h.g.state, State::PreparingRebalance);
    assert!(h.g.members.values().all(|m| m.assignment.is_empty()), "no assignment survives a failed store");
}

#[test]
fn a_store_that_ends_after_the_group_moved_on_is_ignored() {
    let (mut h, leader, follower) = two_joined_storing();
    let gen = h.g.generation;
    let (tf, _) = h.sync(&follower, None, vec![]);
    h.sync(&leader, None, vec![(follower.clone(), Bytes::from_static(b"x"))]);
    assert!(h.g.take_store(1).is_some());
    // The follower leaves meanwhile: the group rebalances, and the
    // follower's parked sync is answered now.
    let (codes, r) = h.g.leave(&h.c, h.now, &[(follower.clone(), None)]);
    assert_eq!(codes, vec![0]);
    assert!(r.iter().any(|x| matches!(x, Reply::Sync(t, _) if *t == tf)));
    assert_eq!(h.g.state, State::PreparingRebalance);
    assert!(h.g.stored(&h.c, h.now, 1, Ok(())).is_empty());
    assert_ne!(h.g.state, State::Stable);
    assert_eq!(h.g.generation, gen);
}

#[test]
fn becoming_empty_is_stored_and_a_restore_is_stable_with_every_member() {
    let (mut h, leader, follower) = two_joined_storing();
    h.c.store_groups = false;
    h.sync_all();
    let stable = h.g.snapshot(h.now);
    // Stable, restored elsewhere at t=1000: same generation, members,
    // assignments, leader; sessions count from the restore.
    let mut r = Group::restore("g".into(), stable.clone(), 1000);
    assert_eq!((r.state, r.generation, r.leader.clone()), (State::Stable, h.g.generation, Some(leader.clone())));
    assert_eq!(r.heartbeat(1500, h.g.generation, &follower, None), 0, "a member heartbeats on at its generation");
    assert_eq!(r.heartbeat(1500, h.g.generation - 1, &follower, None), E::IllegalGeneration.code());
    assert_eq!(r.next_deadline(&h.c), Some(1000 + 10_000), "the leader's session, from the restore");
    let t = 77;
    let s = r.sync(&h.c, 1500, t, sa(h.g.generation, &follower, None, vec![]));
    assert_eq!(sync_result(&s, t).assignment, h.g.members[&follower].assignment, "the assignment kept");
    // A follower rejoining with its metadata unchanged gets the generation
    // back, no rebalance.
    let j = r.join(&h.c, 1500, 78, args(&follower, None), || unreachable!());
    assert_eq!((join_result(&j, 78).generation, r.state), (h.g.generation, State::Stable));
    // The leader, silent, expires: the rest rebalance.
    r.tick(&h.c, 11_000);
    assert!(!r.members.contains_key(&leader));
    assert_eq!(r.state, State::PreparingRebalance);

    // Both leave: Empty, and that is stored (no members, the generation).
    let (_, _) = h.g.leave(&h.c, h.now, &[(leader, None), (follower, None)]);
    assert_eq!(h.g.state, State::Empty);
    let empty = h.g.take_store(1).expect("becoming Empty is stored");
    assert!(empty.members.is_empty() && empty.leader.is_none());
    assert_eq!(empty.generation, stable.generation + 1);
    let r = Group::restore("g".into(), empty, 5000);
    assert_eq!((r.state, r.generation, r.is_idle()), (State::Empty, stable.generation + 1, true));
}

#[test]
fn a_restored_static_member_is_known_by_its_instance() {
    let mut h = Harness::new();
    let (a, _b) = two_statics(&mut h);
    let mut r = Group::restore("g".into(), h.g.snapshot(h.now), 0);
    assert_eq!(r.validate_member("stale-id", Some("i1")), Err(E::FencedInstanceId.code()));
    assert_eq!(r.validate_member(&a, Some("i1")), Ok(()));
    // A restore names a leader only among its members.
    let mut s = h.g.snapshot(h.now);
    s.leader = Some("nobody".into());
    assert!(Group::restore("g".into(), s, 0).leader.is_some_and(|l| l == a || r.members.contains_key(&l)));
    assert_eq!(r.heartbeat(1, h.g.generation, &a, Some("i1")), 0);
}

/// A static member back under a new id in a Stable group, with stores
/// on: its join waits for the store.
fn static_rejoin_storing() -> (Harness, String, Token) {
    let mut h = Harness::new();
    let (a, _b) = two_statics(&mut h);
    h.c.store_groups = true;
    let _ = h.g.take_store(1);
    let (t, r) = h.join(args("", Some("i1")));
    assert!(r.iter().all(|x| !matches!(x, Reply::Join(tok, _) if *tok == t)), "answered before its store: {r:?}");
    assert_eq!(h.g.state, State::Stable, "no rebalance");
    (h, a, t)
}

#[test]
fn a_static_members_new_id_is_answered_once_stored() {
    let (mut h, old, t) = static_rejoin_storing();
    let s = h.g.take_store(2).expect("the new id is stored");
    let new = h.g.statics["i1"].clone();
    assert_ne!(new, old);
    assert!(s.members.iter().any(|m| m.id == new) && !s.members.iter().any(|m| m.id == old));
    assert!(h.g.stored(&h.c, h.now, 1, Ok(())).is_empty(), "another store's result");
    let r = h.g.stored(&h.c, h.now, 2, Ok(()));
    let j = join_result(&r, t);
    assert_eq!((j.error, j.generation, j.member_id.clone()), (0, h.g.generation, new.clone()));
    assert_eq!(h.g.state, State::Stable);
    assert_eq!(h.g.heartbeat(h.now, h.g.generation, &new, Some("i1")), 0);
}

#[test]
fn a_static_members_new_id_that_fails_to_store_is_put_back() {
    let (mut h, old, t) = static_rejoin_storing();
    let new = h.g.statics["i1"].clone();
    h.g.take_store(2).unwrap();
    let r = h.g.stored(&h.c, h.now, 2, Err(E::CoordinatorNotAvailable.code()));
    assert_eq!(join_result(&r, t).error, E::CoordinatorNotAvailable.code());
    // The old id is the member again; the new one is unknown.
    assert_eq!(h.g.statics["i1"], old);
    assert_eq!(h.g.heartbeat(h.now, h.g.generation, &old, Some("i1")), 0);
    assert_eq!(h.g.validate_member(&new, None), Err(E::UnknownMemberId.code()));
    assert_eq!(h.g.state, State::Stable);
}

#[test]
fn a_static_store_that_ends_after_a_rebalance_began_is_ignored() {
    let (mut h, _old, t) = static_rejoin_storing();
    h.g.take_store(2).unwrap();
    // A new member: the group rebalances, and the static member's parked
    // join counts as joined.
    let (_, _, _) = h.join_dynamic(&[]);
    assert_eq!(h.g.state, State::PreparingRebalance);
    assert!(h.g.stored(&h.c, h.now, 2, Err(E::CoordinatorNotAvailable.code())).iter().all(|x| !matches!(x, Reply::Join(tok, _) if *tok == t)));
    assert!(h.g.members.values().any(|m| m.instance_id.as_deref() == Some("i1")));
}
