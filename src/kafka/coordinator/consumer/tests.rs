//! The consumer group state machine against simulated clients that do
//! what KIP-848 asks of them: take the assignment they are given, revoke
//! what it no longer names, and report what they own.

use super::*;
use proptest::prelude::*;

#[derive(Default)]
struct Catalog {
    topics: BTreeMap<String, (TopicId, i32)>,
    version: u64,
}

impl Catalog {
    fn with(topics: &[(&str, i32)]) -> Catalog {
        let mut c = Catalog::default();
        for (n, p) in topics {
            c.add(n, *p);
        }
        c
    }

    fn add(&mut self, name: &str, partitions: i32) {
        let id = *self.topics.get(name).map(|(id, _)| id).unwrap_or(&{
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&(self.topics.len() as u64 + 1).to_be_bytes());
            id
        });
        self.topics.insert(name.to_owned(), (id, partitions));
        self.version += 1;
    }
}

impl Topics for Catalog {
    fn by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.topics.get(name).copied()
    }
    fn by_id(&self, id: &TopicId) -> Option<(String, i32)> {
        self.topics.iter().find(|(_, (i, _))| i == id).map(|(n, (_, p))| (n.clone(), *p))
    }
    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        for n in self.topics.keys() {
            f(n);
        }
    }
    fn version(&self) -> u64 {
        self.version
    }
}

/// A client that does what the protocol asks.
struct Client {
    id: String,
    instance: Option<String>,
    epoch: i32,
    owned: BTreeSet<(TopicId, i32)>,
    names: Vec<String>,
    regex: Option<String>,
}

impl Client {
    fn new(id: &str, names: &[&str]) -> Client {
        Client { id: id.into(), instance: None, epoch: 0, owned: BTreeSet::new(), names: names.iter().map(|s| s.to_string()).collect(), regex: None }
    }

    fn args(&self) -> HeartbeatArgs {
        let joining = self.epoch == 0;
        HeartbeatArgs {
            version: 1,
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance.clone(),
            rebalance_timeout_ms: if joining { 30_000 } else { -1 },
            subscribed_topic_names: (joining && self.regex.is_none()).then(|| self.names.clone()),
            subscribed_topic_regex: if joining { self.regex.clone() } else { None },
            owned: Some(listed(&build(self.owned.iter().copied()))),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            ..Default::default()
        }
    }

    fn beat(&mut self, g: &mut ConsumerGroup, now: i64, topics: &Catalog) -> HeartbeatResult {
        let r = g.heartbeat(&ConsumerConfig::default(), now, topics, self.args(), || unreachable!("v1 members bring ids"));
        assert_eq!(r.error, 0, "{}: {:?}", self.id, r);
        self.epoch = r.member_epoch;
        if let Some(a) = &r.assignment {
            let next: BTreeSet<(TopicId, i32)> = a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
            // Partitions it keeps are never taken away on the way.
            self.owned = next;
        }
        g.check_invariants();
        r
    }
}

fn settle(g: &mut ConsumerGroup, clients: &mut [Client], now: &mut i64, topics: &Catalog) {
    for _ in 0..20 {
        for c in clients.iter_mut() {
            *now += 100;
            c.beat(g, *now, topics);
        }
    }
    assert_eq!(g.state(), "Stable", "{:?}", g.members.values().map(|m| (m.id.clone(), m.state, m.epoch)).collect::<Vec<_>>());
}

fn counts(clients: &[Client]) -> Vec<usize> {
    clients.iter().map(|c| c.owned.len()).collect()
}

#[test]
fn members_share_partitions_and_a_joiner_takes_only_what_is_released() {
    let topics = Catalog::with(&[("t", 12)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients: Vec<Client> = (0..3).map(|i| Client::new(&format!("m{i}"), &["t"])).collect();
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(counts(&clients), vec![4, 4, 4]);
    let before: Vec<BTreeSet<_>> = clients.iter().map(|c| c.owned.clone()).collect();
    // A fourth joins: the others give up one each and keep the rest.
    clients.push(Client::new("m3", &["t"]));
    let r = clients[3].beat(&mut g, now, &topics);
    assert!(r.assignment.as_ref().is_some_and(|a| a.is_empty()), "nothing is free yet: {r:?}");
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(counts(&clients), vec![3, 3, 3, 3]);
    for i in 0..3 {
        assert!(clients[i].owned.is_subset(&before[i]), "m{i} kept its own partitions");
    }
    // One leaves: the rest take its partitions, again only those.
    let gone = clients.remove(1);
    let r = g.heartbeat(&ConsumerConfig::default(), now, &topics, HeartbeatArgs { member_epoch: -1, ..gone.args() }, || unreachable!());
    assert_eq!((r.error, r.member_epoch), (0, -1));
    let before: Vec<BTreeSet<_>> = clients.iter().map(|c| c.owned.clone()).collect();
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(counts(&clients).iter().sum::<usize>(), 12);
    assert!(counts(&clients).iter().all(|n| *n == 4));
    for i in 0..3 {
        assert!(before[i].is_subset(&clients[i].owned), "nothing was revoked from a member that stays");
    }
}

#[test]
fn range_gives_contiguous_ranges_per_topic() {
    let topics = Catalog::with(&[("a", 5), ("b", 2)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients: Vec<Client> = (0..2).map(|i| Client::new(&format!("m{i}"), &["a", "b"])).collect();
    for c in clients.iter_mut() {
        let mut a = c.args();
        a.server_assignor = Some("range".into());
        let r = g.heartbeat(&ConsumerConfig::default(), now, &topics, a, || unreachable!());
        c.epoch = r.member_epoch;
    }
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(g.assignor, "range");
    let (a, b) = (topics.topics["a"].0, topics.topics["b"].0);
    assert_eq!(clients[0].owned, [(a, 0), (a, 1), (a, 2), (b, 0)].into_iter().collect());
    assert_eq!(clients[1].owned, [(a, 3), (a, 4), (b, 1)].into_iter().collect());
}

#[test]
fn bad_heartbeats_get_kafkas_errors_and_leave_nothing_behind() {
    let topics = Catalog::with(&[("t", 4)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    // Two members, so epochs move past 1 and a stale one can be named.
    let mut clients = vec![Client::new("m", &["t"]), Client::new("n", &["t"])];
    settle(&mut g, &mut clients, &mut now, &topics);
    let mut m = clients.remove(0);
    assert!(m.epoch >= 2);
    let (epoch, members) = (g.epoch, g.members.len());
    let cfg = ConsumerConfig::default();
    let code = |g: &mut ConsumerGroup, a: HeartbeatArgs| g.heartbeat(&cfg, 0, &topics, a, || "server-id".into()).error;
    let base = m.args();
    let cases: Vec<(HeartbeatArgs, E)> = vec![
        (HeartbeatArgs { member_id: "ghost".into(), ..base.clone() }, E::UnknownMemberId),
        (HeartbeatArgs { member_epoch: m.epoch + 1, ..base.clone() }, E::FencedMemberEpoch),
        (HeartbeatArgs { member_epoch: m.epoch - 1, owned: Some(vec![([9; 16], vec![0])]), ..base.clone() }, E::FencedMemberEpoch),
        (HeartbeatArgs { member_epoch: -3, ..base.clone() }, E::InvalidRequest),
        (HeartbeatArgs { member_epoch: -2, ..base.clone() }, E::InvalidRequest), // not static
        (HeartbeatArgs { member_id: String::new(), ..base.clone() }, E::InvalidRequest), // v1 brings its id
        (HeartbeatArgs { member_id: "new".into(), member_epoch: 0, rebalance_timeout_ms: 1000, subscribed_topic_names: None, owned: None, ..base.clone() }, E::InvalidRequest),
        (HeartbeatArgs { member_id: "new".into(), member_epoch: 0, rebalance_timeout_ms: -1, subscribed_topic_names: Some(vec![]), owned: None, ..base.clone() }, E::InvalidRequest),
        (HeartbeatArgs { member_id: "new".into(), member_epoch: 0, rebalance_timeout_ms: 1, subscribed_topic_names: Some(vec![]), owned: Some(vec![([1; 16], vec![0])]), ..base.clone() }, E::InvalidRequest),
        (HeartbeatArgs { member_id: "new".into(), member_epoch: 0, rebalance_timeout_ms: 1, subscribed_topic_regex: Some("(unclosed".into()), owned: None, ..base.clone() }, E::InvalidRegularExpression),
        (HeartbeatArgs { member_id: "new".into(), member_epoch: 0, rebalance_timeout_ms: 1, subscribed_topic_regex: Some("a".repeat(MAX_REGEX_LEN + 1)), owned: None, ..base.clone() }, E::InvalidRegularExpression),
        (HeartbeatArgs { server_assignor: Some("sticky".into()), ..base.clone() }, E::UnsupportedAssignor),
        (HeartbeatArgs { instance_id: Some(String::new()), ..base.clone() }, E::InvalidRequest),
        (HeartbeatArgs { instance_id: Some("i-unknown".into()), ..base.clone() }, E::UnknownMemberId),
    ];
    for (a, want) in cases {
        let dbg = format!("{a:?}");
        assert_eq!(code(&mut g, a), want.code(), "{dbg}");
        assert_eq!((g.epoch, g.members.len()), (epoch, members), "{dbg} changed the group");
    }
    // The previous epoch with partitions it still has is fine (its answer
    // with the new epoch may have been lost): here, the same epoch.
    now += 1;
    m.beat(&mut g, now, &topics);
}

#[test]
fn a_static_member_leaves_for_a_while_and_comes_back_to_its_partitions() {
    let topics = Catalog::with(&[("t", 6)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients: Vec<Client> = (0..2).map(|i| Client { instance: Some(format!("i{i}")), ..Client::new(&format!("m{i}"), &["t"]) }).collect();
    settle(&mut g, &mut clients, &mut now, &topics);
    let had = clients[0].owned.clone();
    let epoch = g.epoch;
    let r = g.heartbeat(&ConsumerConfig::default(), now, &topics, HeartbeatArgs { member_epoch: -2, ..clients[0].args() }, || unreachable!());
    assert_eq!((r.error, r.member_epoch), (0, -2));
    // Another incarnation may not take the instance while it is held
    // by a live member, but the one that left may come back.
    let mut back = Client { instance: Some("i0".into()), ..Client::new("m0-restarted", &["t"]) };
    let r = back.beat(&mut g, now + 1000, &topics);
    assert_eq!(r.member_epoch, clients[0].epoch, "its epoch back");
    assert_eq!(back.owned, had, "its partitions back");
    assert_eq!(g.epoch, epoch, "no rebalance");
    let mut dup = Client { instance: Some("i1".into()), ..Client::new("intruder", &["t"]) };
    let r = g.heartbeat(&ConsumerConfig::default(), now, &topics, dup.args(), || unreachable!());
    assert_eq!(r.error, E::UnreleasedInstanceId.code());
    dup.epoch = 0;
    g.check_invariants();
}

#[test]
fn silent_and_stuck_members_are_removed() {
    let cfg = ConsumerConfig::default();
    let topics = Catalog::with(&[("t", 4)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients: Vec<Client> = (0..2).map(|i| Client::new(&format!("m{i}"), &["t"])).collect();
    settle(&mut g, &mut clients, &mut now, &topics);
    // m1 goes silent: after the session timeout it is out and m0 takes all.
    let deadline = g.members["m1"].last_heartbeat_ms + cfg.session_timeout_ms;
    clients[0].beat(&mut g, deadline - 1, &topics);
    g.tick(&cfg, deadline - 1);
    assert_eq!(g.members.len(), 2, "not before its time");
    g.tick(&cfg, deadline);
    assert_eq!(g.members.len(), 1);
    now = deadline;
    let mut m0 = vec![clients.remove(0)];
    settle(&mut g, &mut m0, &mut now, &topics);
    assert_eq!(m0[0].owned.len(), 4);
    // A member that never revokes is fenced after its rebalance timeout.
    let mut m2 = Client::new("m2", &["t"]);
    m2.beat(&mut g, now, &topics);
    let mut stubborn = HeartbeatArgs { owned: None, ..m0[0].args() };
    stubborn.owned = Some(listed(&build(m0[0].owned.iter().copied())));
    let r = g.heartbeat(&cfg, now + 1, &topics, stubborn.clone(), || unreachable!());
    assert_eq!(r.error, 0);
    assert_eq!(g.members["m0"].state, MemberState::UnrevokedPartitions);
    g.tick(&cfg, now + 1 + 30_000);
    assert!(!g.members.contains_key("m0"), "fenced");
    g.check_invariants();
    now += 30_001;
    let mut rest = vec![m2];
    settle(&mut g, &mut rest, &mut now, &topics);
    assert_eq!(rest[0].owned.len(), 4);
}

#[test]
fn a_regex_subscription_picks_up_topics_created_later() {
    let mut topics = Catalog::with(&[("app.a", 2), ("other", 2)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients = vec![Client { regex: Some(r"^app\..*".into()), ..Client::new("m", &[]) }];
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(clients[0].owned.len(), 2);
    topics.add("app.b", 3);
    now += REGEX_REFRESH_MS;
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(clients[0].owned.len(), 5, "app.b joined, other did not");
    // New partitions of a subscribed topic are picked up too.
    topics.add("app.b", 4);
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(clients[0].owned.len(), 6);
}

#[test]
fn commits_and_fetches_check_member_epochs() {
    let topics = Catalog::with(&[("t", 2)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    assert_eq!(g.validate_commit(-1, "", false, 9), Ok(()), "an empty group takes commits without a member");
    let mut m = Client::new("m", &["t"]);
    m.beat(&mut g, 0, &topics);
    let e = g.members["m"].epoch;
    assert_eq!(g.validate_commit(e, "m", false, 9), Ok(()));
    assert_eq!(g.validate_commit(e - 1, "m", false, 9), Err(E::StaleMemberEpoch.code()));
    assert_eq!(g.validate_commit(e + 1, "m", false, 9), Err(E::StaleMemberEpoch.code()));
    assert_eq!(g.validate_commit(e, "m", false, 8), Err(E::UnsupportedVersion.code()));
    assert_eq!(g.validate_commit(e - 1, "m", true, 3), Err(E::IllegalGeneration.code()));
    assert_eq!(g.validate_commit(e, "x", false, 9), Err(E::UnknownMemberId.code()));
    assert_eq!(g.validate_commit(-1, "", false, 9), Err(E::UnknownMemberId.code()));
    assert_eq!(g.validate_fetch(e, Some("m")), Ok(()));
    assert_eq!(g.validate_fetch(e + 1, Some("m")), Err(E::StaleMemberEpoch.code()));
    assert_eq!(g.validate_fetch(0, Some("x")), Err(E::UnknownMemberId.code()));
    assert_eq!(g.validate_fetch(-1, None), Ok(()));
}

#[derive(Debug, Clone)]
enum Op {
    Join(u8),
    Leave(u8),
    Beat(u8),
    /// A member heartbeats without reporting (it has not revoked yet).
    Lag(u8),
    Silence(u16),
    Grow(u8),
    Assignor(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..6).prop_map(Op::Join),
        1 => (0u8..6).prop_map(Op::Leave),
        8 => (0u8..6).prop_map(Op::Beat),
        2 => (0u8..6).prop_map(Op::Lag),
        1 => (0u16..60_000).prop_map(Op::Silence),
        1 => (0u8..3).prop_map(Op::Grow),
        1 => any::<bool>().prop_map(Op::Assignor),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    /// Whatever happens, no partition is owned twice; once everyone
    /// heartbeats for a while, every partition is owned and counts differ
    /// by at most one.
    #[test]
    fn no_partition_is_owned_twice_and_the_group_converges(ops in proptest::collection::vec(op(), 1..120)) {
        let cfg = ConsumerConfig::default();
        let mut topics = Catalog::with(&[("a", 5), ("b", 3), ("c", 1)]);
        let mut g = ConsumerGroup::new("g".into(), 0);
        let mut clients: BTreeMap<u8, Client> = BTreeMap::new();
        let mut now = 0i64;
        for op in ops {
            now += 10;
            match op {
                Op::Join(i) if !clients.contains_key(&i) => {
                    let mut c = Client::new(&format!("m{i}"), &["a", "b", "c"]);
                    c.beat(&mut g, now, &topics);
                    clients.insert(i, c);
                }
                Op::Leave(i) => {
                    if let Some(c) = clients.remove(&i) {
                        let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: -1, ..c.args() }, || unreachable!());
                        prop_assert!(r.error == 0 || r.error == E::UnknownMemberId.code());
                    }
                }
                Op::Beat(i) => {
                    if let Some(c) = clients.get_mut(&i) {
                        let r = g.heartbeat(&cfg, now, &topics, c.args(), || unreachable!());
                        if r.error == E::UnknownMemberId.code() || r.error == E::FencedMemberEpoch.code() {
                            // Expired or fenced: it lets everything go and joins again.
                            c.epoch = 0;
                            c.owned.clear();
                            c.beat(&mut g, now, &topics);
                        } else {
                            prop_assert_eq!(r.error, 0);
                            c.epoch = r.member_epoch;
                            if let Some(a) = r.assignment {
                                c.owned = a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
                            }
                        }
                    }
                }
                Op::Lag(i) => {
                    if let Some(c) = clients.get(&i) {
                        let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { owned: None, ..c.args() }, || unreachable!());
                        prop_assert!(r.error == 0 || r.error == E::UnknownMemberId.code() || r.error == E::FencedMemberEpoch.code());
                    }
                }
                Op::Silence(ms) => {
                    now += ms as i64;
                    g.tick(&cfg, now);
                }
                Op::Grow(t) => {
                    let name = ["a", "b", "c"][t as usize];
                    let n = topics.topics[name].1;
                    topics.add(name, n + 1);
                }
                Op::Assignor(range) => {
                    if let Some(c) = clients.values_mut().next() {
                        let a = HeartbeatArgs { server_assignor: Some(if range { "range" } else { "uniform" }.into()), ..c.args() };
                        let r = g.heartbeat(&cfg, now, &topics, a, || unreachable!());
                        if r.error == 0 {
                            c.epoch = r.member_epoch;
                            if let Some(a) = r.assignment {
                                c.owned = a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
                            }
                        }
                    }
                }
                Op::Join(_) => {}
            }
            g.check_invariants();
            // What a client believes it owns, the group has given it.
            for c in clients.values() {
                if let Some(m) = g.members.get(&c.id) {
                    let given: BTreeSet<_> = flat(&m.assigned).union(&flat(&m.pending_revocation)).copied().collect();
                    prop_assert!(c.owned.is_subset(&given) || c.epoch == 0, "{} owns {:?} beyond {:?}", c.id, c.owned, given);
                }
            }
        }
        if clients.is_empty() {
            return Ok(());
        }
        for _ in 0..30 {
            now += 100;
            for c in clients.values_mut() {
                let r = g.heartbeat(&cfg, now, &topics, c.args(), || unreachable!());
                if r.error != 0 {
                    c.epoch = 0;
                    c.owned.clear();
                    continue;
                }
                c.epoch = r.member_epoch;
                if let Some(a) = r.assignment {
                    c.owned = a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
                }
            }
            g.check_invariants();
        }
        prop_assert_eq!(g.state(), "Stable");
        let total: i32 = topics.topics.values().map(|(_, n)| n).sum();
        let owned: usize = clients.values().map(|c| c.owned.len()).sum();
        prop_assert_eq!(owned, total as usize, "every partition is owned");
        if g.assignor == "uniform" {
            let (lo, hi) = (clients.values().map(|c| c.owned.len()).min().unwrap(), clients.values().map(|c| c.owned.len()).max().unwrap());
            prop_assert!(hi - lo <= 1, "balanced: {lo}..{hi}");
        }
    }
}


#[test]
fn a_takeover_naming_another_members_id_replaces_it_cleanly() {
    let cfg = ConsumerConfig::default();
    let topics = Catalog::with(&[("t", 4)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients = vec![Client { instance: Some("i".into()), ..Client::new("S", &["t"]) }, Client { instance: Some("j".into()), ..Client::new("A", &["t"]) }];
    settle(&mut g, &mut clients, &mut now, &topics);
    // S leaves for a while; a new incarnation of `i` claims A's member id.
    let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: -2, ..clients[0].args() }, || unreachable!());
    assert_eq!(r.error, 0);
    let mut intruder = Client { instance: Some("i".into()), ..Client::new("A", &["t"]) };
    intruder.beat(&mut g, now + 1, &topics);
    assert_eq!(g.members.len(), 1, "A was replaced, not shadowed");
    assert!(!g.statics.contains_key("j"), "A's instance mapping went with it");
    // What used to crash the coordinator: A leaves, then `j` leaves by
    // instance with a made-up member id.
    let r = g.heartbeat(&cfg, now + 2, &topics, HeartbeatArgs { member_epoch: -1, ..intruder.args() }, || unreachable!());
    assert_eq!(r.error, 0);
    let r = g.heartbeat(&cfg, now + 3, &topics, HeartbeatArgs { member_id: "nobody".into(), member_epoch: -2, instance_id: Some("j".into()), ..clients[1].args() }, || unreachable!());
    assert_eq!(r.error, E::UnknownMemberId.code());
    g.check_invariants();
}

#[test]
fn a_returning_static_member_gets_its_new_subscription() {
    let cfg = ConsumerConfig::default();
    let topics = Catalog::with(&[("a", 2), ("b", 2)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients = vec![Client { instance: Some("i".into()), ..Client::new("m", &["a"]) }];
    settle(&mut g, &mut clients, &mut now, &topics);
    assert_eq!(clients[0].owned.len(), 2);
    let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: -2, ..clients[0].args() }, || unreachable!());
    assert_eq!(r.error, 0);
    // Back with `b` added to its subscription.
    let mut back = vec![Client { instance: Some("i".into()), ..Client::new("m2", &["a", "b"]) }];
    settle(&mut g, &mut back, &mut now, &topics);
    assert_eq!(back[0].owned.len(), 4, "it got the new topic too");
}

#[test]
fn kafkas_finer_points_of_epochs_and_leaves() {
    let cfg = ConsumerConfig::default();
    let topics = Catalog::with(&[("t", 4)]);
    let mut g = ConsumerGroup::new("g".into(), 0);
    let mut now = 0;
    let mut clients = vec![Client { instance: Some("i0".into()), ..Client::new("m0", &["t"]) }, Client::new("m1", &["t"])];
    settle(&mut g, &mut clients, &mut now, &topics);
    // The previous epoch without owned partitions proves nothing: fenced.
    let prev = g.members["m0"].previous_epoch;
    let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: prev, owned: None, ..clients[0].args() }, || unreachable!());
    assert_eq!(r.error, E::FencedMemberEpoch.code());
    // The previous epoch with partitions it still has is fine (the answer
    // with the new epoch was lost).
    if prev > 0 {
        let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: prev, ..clients[0].args() }, || unreachable!());
        assert_eq!(r.error, 0, "{r:?}");
    }
    // A static leave naming the instance with another member id is fenced.
    let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_id: "m1".into(), member_epoch: -1, instance_id: Some("i0".into()), ..clients[1].args() }, || unreachable!());
    assert_eq!(r.error, E::FencedInstanceId.code());
    assert_eq!(g.members.len(), 2);
    // A member leaving moves the epoch once, not again at the next
    // heartbeat (the subscriptions' fingerprint follows the leave).
    let r = g.heartbeat(&cfg, now, &topics, HeartbeatArgs { member_epoch: -1, ..clients[1].args() }, || unreachable!());
    assert_eq!(r.error, 0);
    let epoch = g.epoch;
    clients.truncate(1);
    clients[0].beat(&mut g, now + 1, &topics);
    assert_eq!(g.epoch, epoch, "one leave, one epoch");
    // OffsetFetch naming a member with a negative epoch still checks it.
    assert_eq!(g.validate_fetch(-1, Some("ghost")), Err(E::UnknownMemberId.code()));
    // Distinct regexes are bounded per group.
    for i in 0..MAX_GROUP_REGEXES + 1 {
        let mut c = Client { regex: Some(format!("^r{i}$")), ..Client::new(&format!("x{i}"), &[]) };
        let r = g.heartbeat(&cfg, now, &topics, c.args(), || unreachable!());
        if i < MAX_GROUP_REGEXES {
            assert_eq!(r.error, 0);
            c.epoch = r.member_epoch;
        } else {
            assert_eq!(r.error, E::InvalidRegularExpression.code());
        }
    }
    g.check_invariants();
    let _ = &mut now;
}
