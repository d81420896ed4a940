//! The split plan: which topics share a subtree store.
//!
//! Pure and deterministic: the same topics and byte counts give the same
//! plan, whatever order they are passed in.
//!
//! # The objective
//!
//! Reading one topic's records from a window means reading its whole store:
//! the bytes of the store that are not the topic's own are *wasted*. One
//! store per topic wastes nothing but makes a subtree read recombine many
//! files (and the file count grows with the topic count); one store for
//! everything is the reverse. The plan minimises the waste subject to a
//! budget: at most `max_stores` stores per window and/or no store (but the
//! one left at the root) smaller than `min_store_bytes`.
//!
//! # The algorithm
//!
//! A greedy clustering for one size threshold `T`, and a binary search over
//! `T`. The greedy pass walks the topic tree bottom-up (children in name
//! order). At each node, a topic of `T` bytes or more gets a store of its
//! own; what its children leave over (each less than `T`) is packed in name
//! order into stores that close as soon as they reach `T`; whatever is left
//! (less than `T`, with the node's own topic if it is small) moves up to the
//! parent. The root closes the last store. So for a threshold `T`:
//!
//! - every topic of at least `T` bytes reads its store with no waste
//!   (amplification 1.0);
//! - every other store holds less than `2T` bytes, so no read wastes `2T`
//!   or more;
//! - every store but the root's holds at least `T` bytes.
//!
//! With `min_store_bytes` alone, `T` is that size. With `max_stores`, the
//! binary search finds the smallest `T` (the least waste) whose plan has at
//! most that many stores; the plan for `T` above the total is one store, so
//! there always is one. Both: the larger of the two thresholds.
//!
//! Each store is a connected region: the topics it holds lie under one node
//! of the tree (its root), reached from it without passing through another
//! store's root. Sibling groups under the same node share that node as their
//! root, the way `app.codestore.{a..f}` names a range of its children.

use std::collections::BTreeMap;

/// What a plan may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// At most this many stores per window.
    pub max_stores: Option<usize>,
    /// No store below this size, except the last one (the root's).
    pub min_store_bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_stores: None, min_store_bytes: 64 << 20 }
    }
}

/// How a window is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The greedy clustering by volume described above.
    Adaptive(Budget),
    /// The fixed baseline: one store per distinct first three name segments.
    Prefix3,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adaptive" => Ok(Strategy::Adaptive(Budget::default())),
            "prefix3" => Ok(Strategy::Prefix3),
            _ => Err(format!("unknown split {s:?} (adaptive or prefix3)")),
        }
    }
}

/// One store of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePlan {
    /// The tree node the store's topics lie under ("" is the root).
    pub root: String,
    /// A readable name: the root, with the range of its children when the
    /// store holds only some of them.
    pub label: String,
    /// Indexes into the plan's topics, in name order.
    pub topics: Vec<usize>,
    pub bytes: u64,
}

/// A split plan: every topic is in exactly one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The topics with their bytes, sorted by name.
    pub topics: Vec<(String, u64)>,
    pub stores: Vec<StorePlan>,
    /// For each topic, its store.
    pub store_of: Vec<usize>,
    /// The greedy threshold used (0 for prefix3).
    pub threshold: u64,
}

/// Plans `topics` (name, bytes) with `strategy`. Names must be distinct;
/// repeated names are summed.
pub fn plan(topics: &[(String, u64)], strategy: Strategy) -> Plan {
    let topics = normalized(topics);
    match strategy {
        Strategy::Prefix3 => prefix3(topics),
        Strategy::Adaptive(budget) => adaptive(topics, budget),
    }
}

fn prefix3(topics: Vec<(String, u64)>) -> Plan {
    grouped(topics, |name| name.split('.').take(3).collect::<Vec<_>>().join("."))
}

/// A fixed plan: one store per distinct `key` of the topic names (prefix3,
/// or the branch logs seen as a plan, for comparisons).
pub fn by_key(topics: &[(String, u64)], key: impl Fn(&str) -> String) -> Plan {
    grouped(normalized(topics), key)
}

/// Sorted by name, repeated names summed.
fn normalized(topics: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut sorted: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, bytes) in topics {
        let e = sorted.entry(name).or_default();
        *e = e.saturating_add(*bytes);
    }
    sorted.into_iter().map(|(n, b)| (n.to_owned(), b)).collect()
}

/// Groups sorted, distinct topics by `key`.
fn grouped(topics: Vec<(String, u64)>, key: impl Fn(&str) -> String) -> Plan {
    let mut by_key: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, (name, _)) in topics.iter().enumerate() {
        by_key.entry(key(name)).or_default().push(i);
    }
    let mut store_of = vec![0; topics.len()];
    let stores = by_key
        .into_iter()
        .enumerate()
        .map(|(s, (key, members))| {
            for &t in &members {
                store_of[t] = s;
            }
            let bytes = members.iter().fold(0u64, |a, &t| a.saturating_add(topics[t].1));
            StorePlan { root: key.clone(), label: key, topics: members, bytes }
        })
        .collect();
    Plan { topics, stores, store_of, threshold: 0 }
}

/// The topic tree: one node per distinct name prefix.
struct Tree {
    nodes: Vec<Node>,
}

struct Node {
    /// The full prefix ("" for the root).
    name: String,
    /// The topic with exactly this name.
    topic: Option<usize>,
    /// Children in name order (by their last segment).
    children: Vec<usize>,
}

impl Tree {
    fn build(topics: &[(String, u64)]) -> Tree {
        let mut nodes = vec![Node { name: String::new(), topic: None, children: Vec::new() }];
        let mut kids: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new()];
        for (t, (name, _)) in topics.iter().enumerate() {
            let mut at = 0;
            let mut end = 0;
            for (i, seg) in name.split('.').enumerate() {
                end += if i == 0 { seg.len() } else { seg.len() + 1 };
                at = match kids[at].get(seg) {
                    Some(&n) => n,
                    None => {
                        let n = nodes.len();
                        nodes.push(Node { name: name[..end].to_owned(), topic: None, children: Vec::new() });
                        kids.push(BTreeMap::new());
                        kids[at].insert(seg.to_owned(), n);
                        n
                    }
                };
            }
            nodes[at].topic = Some(t);
        }
        for (n, k) in kids.into_iter().enumerate() {
            nodes[n].children = k.into_values().collect();
        }
        Tree { nodes }
    }

    /// Nodes children-first (an iterative post-order: the tree may be deep).
    fn post_order(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut stack = vec![(0usize, false)];
        while let Some((n, done)) = stack.pop() {
            if done {
                out.push(n);
            } else {
                stack.push((n, true));
                for &c in self.nodes[n].children.iter().rev() {
                    stack.push((c, false));
                }
            }
        }
        out
    }
}

/// Where a node's own topic and each child's leftovers went in one greedy
/// pass: a group number, or `None` for "on up to the parent".
struct Pass {
    groups: Vec<Group>,
    own_to: Vec<Option<usize>>,
    child_to: Vec<Vec<Option<usize>>>,
    root_group: Option<usize>,
}

struct Group {
    node: usize,
    /// Range of the node's children in the group, and whether the node's
    /// own topic is in it.
    children: std::ops::Range<usize>,
    own: bool,
}

/// One greedy pass for threshold `t`. With `record` off it only counts
/// stores (the binary search's inner loop).
fn greedy(tree: &Tree, topics: &[(String, u64)], order: &[usize], t: u128, record: bool) -> (usize, Option<Pass>) {
    let n = tree.nodes.len();
    // Leftover bytes of each node's subtree, and whether any topic is left.
    let mut left: Vec<(u64, bool)> = vec![(0, false); n];
    let mut count = 0usize;
    let mut pass = record.then(|| Pass {
        groups: Vec::new(),
        own_to: vec![None; n],
        child_to: tree.nodes.iter().map(|nd| vec![None; nd.children.len()]).collect(),
        root_group: None,
    });
    for &v in order {
        let node = &tree.nodes[v];
        let mut close = |pass: &mut Option<Pass>, children: std::ops::Range<usize>, own: bool| {
            count += 1;
            if let Some(p) = pass.as_mut() {
                let g = p.groups.len();
                p.groups.push(Group { node: v, children: children.clone(), own });
                for c in children {
                    p.child_to[v][c] = Some(g);
                }
                if own {
                    p.own_to[v] = Some(g);
                }
            }
        };
        let mut own_left = false;
        let mut own_bytes = 0;
        if let Some(topic) = node.topic {
            let b = topics[topic].1;
            if b as u128 >= t {
                close(&mut pass, 0..0, true);
            } else {
                own_left = true;
                own_bytes = b;
            }
        }
        let mut acc = 0u64;
        let mut any = false;
        let mut start = 0;
        for (i, &c) in node.children.iter().enumerate() {
            let (b, has) = left[c];
            acc = acc.saturating_add(b);
            any |= has;
            if acc as u128 >= t && any {
                close(&mut pass, start..i + 1, false);
                (acc, any, start) = (0, false, i + 1);
            }
        }
        let rest = (acc.saturating_add(own_bytes), any || own_left);
        left[v] = if rest.0 as u128 >= t && rest.1 {
            close(&mut pass, start..node.children.len(), own_left);
            (0, false)
        } else {
            rest
        };
    }
    if left[0].1 {
        count += 1;
        if let Some(p) = pass.as_mut() {
            p.root_group = Some(p.groups.len());
            p.groups.push(Group { node: 0, children: 0..tree.nodes[0].children.len(), own: true });
        }
    }
    (count, pass)
}

fn adaptive(topics: Vec<(String, u64)>, budget: Budget) -> Plan {
    let tree = Tree::build(&topics);
    let order = tree.post_order();
    // Thresholds are u128: one above the total must exceed every sum.
    let total: u128 = topics.iter().map(|t| t.1 as u128).sum();
    let mut t = budget.min_store_bytes.max(1) as u128;
    if let Some(max) = budget.max_stores {
        // Smallest threshold whose plan fits: `hi` always fits (above the
        // total everything stays at the root: one store).
        let (mut lo, mut hi) = (1u128, total + 1);
        if greedy(&tree, &topics, &order, lo, false).0 <= max.max(1) {
            hi = lo;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if greedy(&tree, &topics, &order, mid, false).0 <= max.max(1) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        t = t.max(hi);
    }
    let (_, pass) = greedy(&tree, &topics, &order, t, true);
    assign(&tree, topics, pass.expect("recorded"), u64::try_from(t).unwrap_or(u64::MAX))
}

/// Turns a recorded pass into the plan.
fn assign(tree: &Tree, topics: Vec<(String, u64)>, pass: Pass, t: u64) -> Plan {
    // Top down: a topic goes where its node sends it, else where its
    // parent sent the node's leftovers.
    let mut store_of = vec![usize::MAX; topics.len()];
    let mut stack: Vec<(usize, Option<usize>)> = vec![(0, pass.root_group)];
    while let Some((v, inherited)) = stack.pop() {
        let node = &tree.nodes[v];
        if let Some(topic) = node.topic {
            store_of[topic] = pass.own_to[v].or(inherited).expect("every leftover reaches a group");
        }
        for (i, &c) in node.children.iter().enumerate() {
            stack.push((c, pass.child_to[v][i].or(inherited)));
        }
    }
    let mut stores: Vec<StorePlan> = pass
        .groups
        .iter()
        .map(|g| {
            let node = &tree.nodes[g.node];
            let all = g.children.start == 0 && g.children.end == node.children.len() && (g.own || node.topic.is_none());
            let label = if all || g.children.is_empty() {
                if node.name.is_empty() { "(root)".to_owned() } else { node.name.clone() }
            } else {
                let seg = |c: usize| tree.nodes[c].name.rsplit('.').next().unwrap_or("").to_owned();
                let (a, b) = (seg(node.children[g.children.start]), seg(node.children[g.children.end - 1]));
                let range = if a == b { a } else { format!("{a}..{b}") };
                if node.name.is_empty() { format!("{{{range}}}") } else { format!("{}.{{{range}}}", node.name) }
            };
            StorePlan { root: node.name.clone(), label, topics: Vec::new(), bytes: 0 }
        })
        .collect();
    for (topic, &s) in store_of.iter().enumerate() {
        stores[s].topics.push(topic);
        stores[s].bytes = stores[s].bytes.saturating_add(topics[topic].1);
    }
    // Groups that ended up empty (a range of zero-topic children cannot
    // close, but be safe) are dropped, and stores are numbered in the order
    // of their first topic.
    let mut order: Vec<usize> = (0..stores.len()).filter(|&s| !stores[s].topics.is_empty()).collect();
    order.sort_by_key(|&s| stores[s].topics[0]);
    let mut renumber = vec![usize::MAX; stores.len()];
    for (new, &old) in order.iter().enumerate() {
        renumber[old] = new;
    }
    let stores: Vec<StorePlan> = order.iter().map(|&s| std::mem::replace(&mut stores[s], StorePlan { root: String::new(), label: String::new(), topics: Vec::new(), bytes: 0 })).collect();
    for s in store_of.iter_mut() {
        *s = renumber[*s];
    }
    Plan { topics, stores, store_of, threshold: t }
}

/// The four numbers of a plan (and its store count): what reading each
/// topic of a window costs beyond its own bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Numbers {
    pub stores: usize,
    /// Per topic (plan order): bytes of its store that are not its own.
    pub wasted: Vec<u64>,
    /// Their sum over all topics.
    pub total_wasted: u64,
    /// The topic whose read wastes most, with that waste.
    pub worst_waste: Option<(usize, u64)>,
    /// The worst ratio of bytes read to useful bytes, over topics with
    /// bytes, with its topic.
    pub worst_ratio: Option<(usize, f64)>,
}

/// The one function every report, test and benchmark uses.
pub fn numbers(plan: &Plan) -> Numbers {
    let mut wasted = Vec::with_capacity(plan.topics.len());
    let mut worst_waste: Option<(usize, u64)> = None;
    let mut worst_ratio: Option<(usize, f64)> = None;
    for (t, (_, bytes)) in plan.topics.iter().enumerate() {
        let store = plan.stores[plan.store_of[t]].bytes;
        let w = store - bytes;
        wasted.push(w);
        if worst_waste.is_none_or(|(_, x)| w > x) {
            worst_waste = Some((t, w));
        }
        if *bytes > 0 {
            let r = store as f64 / *bytes as f64;
            if worst_ratio.is_none_or(|(_, x)| r > x) {
                worst_ratio = Some((t, r));
            }
        }
    }
    Numbers { stores: plan.stores.len(), total_wasted: wasted.iter().fold(0u64, |a, w| a.saturating_add(*w)), wasted, worst_waste, worst_ratio }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(n, b)| (n.to_string(), *b)).collect()
    }

    fn store_of<'a>(p: &'a Plan, name: &str) -> &'a StorePlan {
        let t = p.topics.iter().position(|(n, _)| n == name).expect("topic in plan");
        &p.stores[p.store_of[t]]
    }

    /// Every topic in exactly one store, stores' bytes add up, every store
    /// connected under its root.
    fn check_valid(p: &Plan) {
        let mut seen = vec![0; p.topics.len()];
        for (s, store) in p.stores.iter().enumerate() {
            assert!(!store.topics.is_empty());
            assert_eq!(store.bytes, store.topics.iter().map(|&t| p.topics[t].1).sum::<u64>());
            for &t in &store.topics {
                seen[t] += 1;
                assert_eq!(p.store_of[t], s);
                let name = &p.topics[t].0;
                assert!(store.root.is_empty() || name == &store.root || name.starts_with(&format!("{}.", store.root)), "{name} under {}", store.root);
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }

    const MB: u64 = 1 << 20;

    #[test]
    fn a_big_topic_gets_its_own_store_and_small_siblings_share_one() {
        // The case from the field: 2.72 GB next to 10 MB and 28.5 MB.
        let t = topics(&[("app.codestore.commits", 2720 * MB), ("app.codestore.reviews", 10 * MB), ("app.codestore.tags", 28 * MB), ("app.billing.x", 3 * MB), ("app.billing.y", 2 * MB)]);
        let p = plan(&t, Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: 64 * MB }));
        check_valid(&p);
        assert_eq!(store_of(&p, "app.codestore.commits").topics.len(), 1);
        assert_eq!(store_of(&p, "app.codestore.reviews"), store_of(&p, "app.codestore.tags"));
        assert_eq!(store_of(&p, "app.billing.x"), store_of(&p, "app.billing.y"));
        let n = numbers(&p);
        assert_eq!(n.wasted[p.topics.iter().position(|t| t.0 == "app.codestore.commits").unwrap()], 0);
        // prefix3 puts the small ones with the big one.
        let b = plan(&t, Strategy::Prefix3);
        check_valid(&b);
        assert_eq!(store_of(&b, "app.codestore.commits").topics.len(), 1);
        assert_eq!(b.stores.len(), 5, "prefix3 of three-segment names: one store each");
        let deep = topics(&[("app.codestore.commits.main", 2720 * MB), ("app.codestore.commits.x", 10 * MB), ("app.codestore.commits.y", 28 * MB)]);
        let b = plan(&deep, Strategy::Prefix3);
        assert_eq!(b.stores.len(), 1, "prefix3 puts the big topic with its small siblings");
        let a = plan(&deep, Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: 64 * MB }));
        assert_eq!(a.stores.len(), 2);
        assert_eq!(numbers(&a).total_wasted, 2 * 10 * MB + 2 * 28 * MB - 10 * MB - 28 * MB);
        assert!(numbers(&a).total_wasted * 10 < numbers(&b).total_wasted);
    }

    #[test]
    fn the_store_budget_is_respected_and_spent() {
        let mut t = Vec::new();
        for a in 0..10 {
            for b in 0..10 {
                for c in 0..10 {
                    t.push((format!("a{a}.b{b}.c{c}"), (1 + a * 100 + b * 10 + c) as u64 * 1000));
                }
            }
        }
        for max in [1, 2, 5, 17, 100, 999, 1000, 5000] {
            let p = plan(&t, Strategy::Adaptive(Budget { max_stores: Some(max), min_store_bytes: 0 }));
            check_valid(&p);
            assert!(p.stores.len() <= max, "{} stores for a budget of {max}", p.stores.len());
            // The threshold is the smallest that fits: one byte less does not.
            if p.threshold > 1 {
                let tree = Tree::build(&p.topics);
                let order = tree.post_order();
                assert!(greedy(&tree, &p.topics, &order, p.threshold as u128 - 1, false).0 > max);
            }
        }
        let all = plan(&t, Strategy::Adaptive(Budget { max_stores: Some(5000), min_store_bytes: 0 }));
        assert_eq!(all.stores.len(), 1000, "a budget above the topic count gives one store per topic");
        assert_eq!(numbers(&all).total_wasted, 0);
        // A minimum size bounds every store but the root's, and every read's waste.
        let min = 5_000_000;
        let p = plan(&t, Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: min }));
        check_valid(&p);
        let small = p.stores.iter().filter(|s| s.bytes < min).count();
        assert!(small <= 1, "{small} stores below the minimum");
        let n = numbers(&p);
        assert!(n.worst_waste.unwrap().1 < 2 * min);
        for (i, (_, b)) in p.topics.iter().enumerate() {
            if *b >= min {
                assert_eq!(n.wasted[i], 0);
            }
        }
    }

    #[test]
    fn plans_are_deterministic_whatever_the_input_order() {
        let mut t: Vec<(String, u64)> = (0..500).map(|i| (format!("x.{}.{}", i % 7, i), (i * 7919 % 1000) as u64 * 1000)).collect();
        let a = plan(&t, Strategy::Adaptive(Budget { max_stores: Some(20), min_store_bytes: 0 }));
        t.reverse();
        let b = plan(&t, Strategy::Adaptive(Budget { max_stores: Some(20), min_store_bytes: 0 }));
        assert_eq!(a, b);
        assert_eq!(plan(&t, Strategy::Prefix3), plan(&t, Strategy::Prefix3));
    }

    #[test]
    fn degenerate_trees() {
        // One topic.
        let p = plan(&topics(&[("solo", 123)]), Strategy::Adaptive(Budget::default()));
        check_valid(&p);
        assert_eq!(p.stores.len(), 1);
        assert_eq!(numbers(&p).total_wasted, 0);
        // No topics, zero-byte topics.
        assert!(plan(&[], Strategy::Adaptive(Budget::default())).stores.is_empty());
        let p = plan(&topics(&[("a", 0), ("a.b", 0)]), Strategy::Adaptive(Budget { max_stores: Some(3), min_store_bytes: 0 }));
        check_valid(&p);
        // 100,000 flat siblings: packed into groups under the root.
        let flat: Vec<(String, u64)> = (0..100_000).map(|i| (format!("t{i:06}"), 1000 + i % 17)).collect();
        let p = plan(&flat, Strategy::Adaptive(Budget { max_stores: Some(100), min_store_bytes: 0 }));
        check_valid(&p);
        assert!(p.stores.len() <= 100 && p.stores.len() >= 90, "{} stores", p.stores.len());
        let p = plan(&flat, Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: 10 << 20 }));
        check_valid(&p);
        // A 20-level chain, each level a topic.
        let chain: Vec<(String, u64)> = (1..=20).map(|d| ((0..d).map(|i| format!("l{i}")).collect::<Vec<_>>().join("."), d as u64 * MB)).collect();
        for max in [1, 3, 20] {
            let p = plan(&chain, Strategy::Adaptive(Budget { max_stores: Some(max), min_store_bytes: 0 }));
            check_valid(&p);
            assert!(p.stores.len() <= max);
        }
        let p = plan(&chain, Strategy::Adaptive(Budget { max_stores: Some(20), min_store_bytes: 0 }));
        assert_eq!(p.stores.len(), 20);
        // Names with empty segments are still a tree.
        let odd = topics(&[("a..b", 5), (".x", 6), ("a.", 7), ("a", 8)]);
        let p = plan(&odd, Strategy::Adaptive(Budget { max_stores: Some(2), min_store_bytes: 0 }));
        check_valid(&p);
    }

    #[test]
    fn numbers_are_the_definitions() {
        let t = topics(&[("a.x", 10), ("a.y", 30), ("b", 60)]);
        let p = plan(&t, Strategy::Adaptive(Budget { max_stores: Some(2), min_store_bytes: 0 }));
        check_valid(&p);
        assert_eq!(p.stores.len(), 2);
        let n = numbers(&p);
        assert_eq!(n.wasted, vec![30, 10, 0]);
        assert_eq!(n.total_wasted, 40);
        assert_eq!(n.worst_waste, Some((0, 30)));
        assert_eq!(n.worst_ratio.map(|(t, r)| (t, (r * 100.0).round())), Some((0, 400.0)));
    }
}
