//! Client quotas, Kafka's model: a producer byte rate, a consumer byte
//! rate and a share of request-handling time, set for a user, a client id
//! or the pair, each with defaults; durable in the catalog
//! (`quota/<user>\0<client-id>`), managed with DescribeClientQuotas and
//! AlterClientQuotas, and asked by the Kafka listener and the REST bridge
//! alike.
//!
//! # Which quota applies
//!
//! For a request of user `u` and client id `c`, the first of these
//! entities with a value for the key wins (Kafka's order):
//!
//! ```text
//! user=u,client-id=c   user=u,client-id=<default>   user=u
//! user=<default>,client-id=c   user=<default>,client-id=<default>   user=<default>
//! client-id=c   client-id=<default>
//! ```
//!
//! The entity that wins also says who shares the quota: a user's quota is
//! one budget for all its clients, a client id's one budget for every user
//! using it, a pair's one for that pair. A default is applied to each user
//! (client id) on its own, never shared among them.
//!
//! # Enforcement
//!
//! Each shared budget is a token bucket refilled at the quota's rate and
//! holding at most one second's worth. Use is charged after the fact (a
//! produce request's size, a fetch response's size, the time a request's
//! handler ran) and may run the bucket into debt; the debt over the rate is
//! the throttle time. The Kafka listener puts it in the response's
//! `throttle_time_ms` and starts the connection's next request only after
//! it (Kafka mutes the channel), so over time a client gets its rate, and
//! the one-second burst is all it gets beyond it.
//!
//! Without any quota configured, nothing is looked up or counted.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::meta::{Catalog, MetaError};

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `producer_byte_rate`: produce request bytes per second.
    Produce = 0,
    /// `consumer_byte_rate`: fetch response bytes per second.
    Fetch = 1,
    /// `request_percentage`: handler time, in percent of one thread.
    Request = 2,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Produce, Kind::Fetch, Kind::Request];

    /// The configuration key, as Kafka names it.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Produce => "producer_byte_rate",
            Kind::Fetch => "consumer_byte_rate",
            Kind::Request => "request_percentage",
        }
    }

    pub fn parse(key: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.key() == key)
    }

    /// Units a second the bucket refills for a configured `value`: bytes
    /// for byte rates, nanoseconds of handler time for a percentage.
    fn per_second(self, value: f64) -> f64 {
        match self {
            Kind::Request => value / 100.0 * 1e9,
            _ => value,
        }
    }

    /// Why Kafka would refuse `value` for this key, if it would.
    pub fn invalid(self, value: f64) -> Option<String> {
        if !value.is_finite() || value <= 0.0 {
            return Some(format!("{} must be a positive number, not {value}", self.key()));
        }
        // Byte rates are longs in Kafka's configuration.
        if self != Kind::Request && (value.fract() != 0.0 || value > i64::MAX as f64) {
            return Some(format!("{} must be a whole number of bytes per second, not {value}", self.key()));
        }
        None
    }
}

/// An entity name: a user or client id, or the default for all of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Name {
    Default,
    Named(String),
}

impl Name {
    /// The wire form: the name, or null for the default.
    pub fn wire(&self) -> Option<&str> {
        match self {
            Name::Default => None,
            Name::Named(n) => Some(n),
        }
    }

    fn from_wire(n: Option<&str>) -> Name {
        n.map_or(Name::Default, |n| Name::Named(n.to_owned()))
    }

    fn is(&self, n: &str) -> bool {
        matches!(self, Name::Named(m) if m == n)
    }
}

/// The entity types Kafka's quotas name.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

/// What a quota is set for: a user, a client id, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Entity {
    pub user: Option<Name>,
    pub client_id: Option<Name>,
}

impl Entity {
    /// From the wire's (type, name) pairs, refused as Kafka refuses them:
    /// a type given twice, an unknown type, an empty entity; `ip` quotas
    /// (connection rates) are not served.
    pub fn from_wire<'a>(parts: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Result<Entity, String> {
        let mut e = Entity::default();
        for (kind, name) in parts {
            let slot = match kind {
                USER => &mut e.user,
                CLIENT_ID => &mut e.client_id,
                IP => return Err("ip quotas (connection_creation_rate) are not supported by this broker".into()),
                other => return Err(format!("Unhandled client quota entity type: {other}")),
            };
            if slot.is_some() {
                return Err(format!("Duplicate {kind} entity type in the quota entity"));
            }
            if name.is_some_and(|n| n.contains('\0')) {
                return Err(format!("The {kind} name holds a NUL character"));
            }
            if name.is_some_and(str::is_empty) {
                return Err(format!("Empty {kind} not supported"));
            }
            *slot = Some(Name::from_wire(name));
        }
        if e.user.is_none() && e.client_id.is_none() {
            return Err("The quota entity is empty".into());
        }
        Ok(e)
    }

    /// The wire's (type, name) pairs.
    pub fn to_wire(&self) -> Vec<(&'static str, Option<&str>)> {
        let mut out = Vec::with_capacity(2);
        if let Some(u) = &self.user {
            out.push((USER, u.wire()));
        }
        if let Some(c) = &self.client_id {
            out.push((CLIENT_ID, c.wire()));
        }
        out
    }

    /// The catalog key: each part absent (empty), the default (`\u{1}`) or
    /// `=name`, joined by NUL (names may not hold it).
    /// The entity's identity (the catalog's key, and in cluster mode the
    /// etcd key's).
    pub fn key(&self) -> String {
        let part = |n: &Option<Name>| match n {
            None => String::new(),
            Some(Name::Default) => "\u{1}".into(),
            Some(Name::Named(s)) => format!("={s}"),
        };
        format!("quota/{}\0{}", part(&self.user), part(&self.client_id))
    }

    fn name(&self, kind: &str) -> Option<&Name> {
        match kind {
            USER => self.user.as_ref(),
            CLIENT_ID => self.client_id.as_ref(),
            _ => None,
        }
    }
}

/// One entity's values, as the catalog keeps them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaRecord {
    pub entity: Entity,
    pub values: BTreeMap<String, f64>,
}

/// A DescribeClientQuotas filter component.
#[derive(Debug, Clone)]
pub enum Match {
    /// This name exactly.
    Exact(String),
    /// The default entity of the type.
    Default,
    /// Any entity of the type, the default included.
    Any,
}

/// One change to an entity's values: set (`Some`) or remove (`None`).
pub type Op = (Kind, Option<f64>);

/// Usage charged in one bucket, and how much it holds.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Refills at `rate` a second up to one second's worth, takes
    /// `amount`, and says how long the debt (if any) takes to repay. The
    /// debt is at most [`WINDOW`]'s worth: one huge request is paid for
    /// with a window's wait, not hours (Kafka's rate is also measured over
    /// a window, and it bounds a fetch to what the window allows).
    fn charge(&mut self, amount: f64, rate: f64, now: Instant) -> Duration {
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate).min(rate);
        self.at = now.max(self.at);
        self.tokens = (self.tokens - amount).max(-rate * WINDOW.as_secs_f64());
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate)
        }
    }
}

/// The longest debt a bucket holds, in time at its rate.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Buckets kept before idle ones nobody holds are forgotten.
const BUCKET_KEYS: usize = 100_000;

/// The quotas that apply to one (user, client id), with their buckets:
/// what a connection keeps between requests, re-resolved when the
/// configuration changes.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    generation: u64,
    limits: [Option<(f64, Arc<Mutex<Bucket>>)>; 3],
}

impl Resolved {
    /// Charges `amount` (bytes, or nanoseconds for the request quota) and
    /// returns the throttle time it leaves (zero: within the quota).
    pub fn charge(&self, kind: Kind, amount: f64, now: Instant) -> Duration {
        match &self.limits[kind as usize] {
            Some((rate, b)) => b.lock().expect("quota bucket lock").charge(amount, *rate, now),
            None => Duration::ZERO,
        }
    }

    /// How long until the bucket is out of debt (zero: it is not).
    pub fn debt(&self, kind: Kind, now: Instant) -> Duration {
        self.charge(kind, 0.0, now)
    }

    pub fn limits(&self, kind: Kind) -> bool {
        self.limits[kind as usize].is_some()
    }

    /// The most a single charge of `kind` should be: a [`WINDOW`] at the
    /// rate (a Fetch asks for no more).
    pub fn window_amount(&self, kind: Kind) -> Option<f64> {
        self.limits[kind as usize].as_ref().map(|(rate, _)| rate * WINDOW.as_secs_f64())
    }
}

/// Every entity's quotas.
pub type Entries = BTreeMap<Entity, BTreeMap<Kind, f64>>;

/// The cluster's quotas, when they are not the node's own (cluster mode:
/// etcd, so a quota set through any broker holds at every broker).
pub trait QuotaDirectory: Send + Sync {
    /// Applies each entity's changes to what the cluster holds of it now,
    /// and returns once this node's view has them: the cluster's quotas
    /// then, and the revision they are at. Blocking.
    fn alter(&self, changes: &[(Entity, Vec<Op>)]) -> Result<(i64, Entries), String>;
}

/// An entity's values after `ops`.
pub fn altered(mut values: BTreeMap<Kind, f64>, ops: &[Op]) -> BTreeMap<Kind, f64> {
    for (kind, value) in ops {
        match value {
            Some(v) => values.insert(*kind, *v),
            None => values.remove(kind),
        };
    }
    values
}

impl QuotaRecord {
    /// The values this node knows (keys of a newer version are left out).
    pub fn known(&self) -> BTreeMap<Kind, f64> {
        self.values.iter().filter_map(|(k, v)| Some((Kind::parse(k)?, *v))).collect()
    }

    pub fn new(entity: Entity, values: &BTreeMap<Kind, f64>) -> QuotaRecord {
        QuotaRecord { entity, values: values.iter().map(|(k, v)| (k.key().to_owned(), *v)).collect() }
    }
}

pub struct Quotas {
    entries: RwLock<Arc<Entries>>,
    /// Whether any quota is set: without one, nothing is resolved.
    any: AtomicBool,
    /// Bumped on every change: a connection's [`Resolved`] of an older
    /// generation is resolved again.
    generation: AtomicU64,
    /// Held by a writer across its read, catalog write and publish; in
    /// cluster mode, the revision of the cluster's quotas held.
    writing: Mutex<i64>,
    /// Cluster mode: where quotas live (etcd); this node follows it.
    directory: std::sync::OnceLock<Arc<dyn QuotaDirectory>>,
    buckets: Mutex<HashMap<BucketKey, Arc<Mutex<Bucket>>>>,
    /// Keys the hash that names a bucket (fresh each start).
    hasher: (std::collections::hash_map::RandomState, std::collections::hash_map::RandomState),
}

/// A shared budget: the quota, and a 128-bit keyed hash of the user and
/// client id sharing it (`None` where the quota's entity does not name
/// them). Hashed, so a client cycling through long client ids holds 17
/// bytes per bucket, not its names.
type BucketKey = (Kind, u128);

#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error("{0}")]
    Invalid(String),
    #[error("the catalog write failed: {0}")]
    Storage(String),
    #[error("the cluster's quotas could not be changed: {0}")]
    Cluster(String),
}

impl Quotas {
    pub fn load(catalog: &Catalog) -> Result<Quotas, MetaError> {
        let mut entries = BTreeMap::new();
        for r in catalog.quotas()? {
            let values = r.known();
            if !values.is_empty() {
                entries.insert(r.entity, values);
            }
        }
        Ok(Quotas::with(entries))
    }

    pub fn in_memory() -> Quotas {
        Quotas::with(BTreeMap::new())
    }

    fn with(entries: BTreeMap<Entity, BTreeMap<Kind, f64>>) -> Quotas {
        Quotas {
            any: AtomicBool::new(!entries.is_empty()),
            entries: RwLock::new(Arc::new(entries)),
            generation: AtomicU64::new(1),
            writing: Mutex::new(0),
            directory: Default::default(),
            buckets: Mutex::new(HashMap::new()),
            hasher: Default::default(),
        }
    }

    fn bucket_key(&self, kind: Kind, user: Option<&str>, client: Option<&str>) -> BucketKey {
        use std::hash::BuildHasher;
        let halves = (self.hasher.0.hash_one((user, client)), self.hasher.1.hash_one((user, client)));
        (kind, (u128::from(halves.0) << 64) | u128::from(halves.1))
    }

    /// Whether any quota is configured (one atomic load: the fast path of
    /// every request).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn snapshot(&self) -> Arc<Entries> {
        self.entries.read().expect("quotas lock").clone()
    }

    /// The quotas for `user` and `client`, reusing `cached` if nothing
    /// changed since it was resolved.
    pub fn resolve(&self, user: &str, client: &str, cached: Option<&Resolved>) -> Resolved {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(c) = cached.filter(|c| c.generation == generation) {
            return c.clone();
        }
        let entries = self.snapshot();
        let named = |n: &str| Some(Name::Named(n.to_owned()));
        let default = || Some(Name::Default);
        // Kafka's order; each with who shares the bucket: (user, client).
        let order: [(Entity, bool, bool); 8] = [
            (Entity { user: named(user), client_id: named(client) }, true, true),
            (Entity { user: named(user), client_id: default() }, true, true),
            (Entity { user: named(user), client_id: None }, true, false),
            (Entity { user: default(), client_id: named(client) }, true, true),
            (Entity { user: default(), client_id: default() }, true, true),
            (Entity { user: default(), client_id: None }, true, false),
            (Entity { user: None, client_id: named(client) }, false, true),
            (Entity { user: None, client_id: default() }, false, true),
        ];
        let mut limits: [Option<(f64, Arc<Mutex<Bucket>>)>; 3] = Default::default();
        for kind in Kind::ALL {
            let Some((value, by_user, by_client)) = order.iter().find_map(|(e, u, c)| Some((*entries.get(e)?.get(&kind)?, *u, *c))) else {
                continue;
            };
            let key = self.bucket_key(kind, by_user.then_some(user), by_client.then_some(client));
            let rate = kind.per_second(value);
            limits[kind as usize] = Some((rate, self.bucket(key, rate)));
        }
        Resolved { generation, limits }
    }

    fn bucket(&self, key: BucketKey, rate: f64) -> Arc<Mutex<Bucket>> {
        let mut map = self.buckets.lock().expect("quota buckets lock");
        if map.len() >= BUCKET_KEYS && !map.contains_key(&key) {
            // Only buckets nobody holds are forgotten: a connection's
            // bucket stays the one its peers charge.
            map.retain(|_, b| Arc::strong_count(b) > 1);
        }
        map.entry(key).or_insert_with(|| Arc::new(Mutex::new(Bucket { tokens: rate, at: Instant::now() }))).clone()
    }

    /// The entities matching `filter` (DescribeClientQuotas): every
    /// component's type is present and matches; with `strict`, the entity
    /// has no other type.
    pub fn describe(&self, filter: &[(String, Match)], strict: bool) -> Vec<(Entity, Vec<(Kind, f64)>)> {
        let entries = self.snapshot();
        entries
            .iter()
            .filter(|(e, _)| {
                let matches = filter.iter().all(|(kind, m)| match (e.name(kind), m) {
                    (None, _) => false,
                    (Some(n), Match::Exact(x)) => n.is(x),
                    (Some(n), Match::Default) => *n == Name::Default,
                    (Some(_), Match::Any) => true,
                });
                let only = !strict || e.to_wire().iter().all(|(kind, _)| filter.iter().any(|(k, _)| k == kind));
                matches && only
            })
            .map(|(e, v)| (e.clone(), v.iter().map(|(k, v)| (*k, *v)).collect()))
            .collect()
    }

    /// Why Kafka would refuse this change, if it would.
    pub fn check(ops: &[Op]) -> Option<String> {
        let mut seen = std::collections::HashSet::new();
        for (kind, value) in ops {
            if !seen.insert(*kind) {
                return Some(format!("Duplicate quota key {} for the entity", kind.key()));
            }
            if let Some(why) = value.and_then(|v| kind.invalid(v)) {
                return Some(why);
            }
        }
        None
    }

    /// Applies each entity's changes (AlterClientQuotas), all durably in one
    /// catalog write; entries already refused are not passed in.
    pub fn alter(&self, catalog: &Catalog, changes: &[(Entity, Vec<Op>)]) -> Result<(), QuotaError> {
        if let Some(directory) = self.directory.get() {
            let (revision, entries) = directory.alter(changes).map_err(QuotaError::Cluster)?;
            self.follow(revision, entries);
            return Ok(());
        }
        let mut writing = self.writing.lock().expect("quota writer lock");
        let mut entries = (*self.snapshot()).clone();
        let mut records = Vec::with_capacity(changes.len());
        for (entity, ops) in changes {
            let values = altered(entries.remove(entity).unwrap_or_default(), ops);
            let record = QuotaRecord::new(entity.clone(), &values);
            if !values.is_empty() {
                entries.insert(entity.clone(), values);
            }
            records.push((entity.key(), record));
        }
        catalog.put_quotas(&records.iter().map(|(k, r)| (k.as_str(), (!r.values.is_empty()).then_some(r))).collect::<Vec<_>>()).map_err(|e| QuotaError::Storage(e.to_string()))?;
        self.publish(&mut writing, 0, entries);
        Ok(())
    }

    /// Cluster mode: quotas live in `directory` from now on, and this
    /// node's are the cluster's at `revision`. Set once, before the node
    /// serves.
    pub fn set_directory(&self, directory: Arc<dyn QuotaDirectory>, revision: i64, entries: Entries) {
        if self.directory.set(directory).is_err() {
            panic!("the quota directory is set once");
        }
        self.follow(revision, entries);
    }

    /// Cluster mode: the cluster's quotas at `revision`, taken unless this
    /// node already holds a later revision's.
    pub fn follow(&self, revision: i64, entries: Entries) {
        let mut writing = self.writing.lock().expect("quota writer lock");
        if revision > *writing {
            self.publish(&mut writing, revision, entries);
        }
    }

    fn publish(&self, at: &mut i64, revision: i64, entries: Entries) {
        *at = revision;
        self.any.store(!entries.is_empty(), Ordering::Release);
        *self.entries.write().expect("quotas lock") = Arc::new(entries);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(u: &str) -> Entity {
        Entity { user: Some(Name::Named(u.into())), client_id: None }
    }

    fn set(q: &Quotas, catalog: &Catalog, e: Entity, kind: Kind, v: f64) {
        q.alter(catalog, &[(e, vec![(kind, Some(v))])]).unwrap();
    }

    fn rate(r: &Resolved, kind: Kind) -> Option<f64> {
        r.limits[kind as usize].as_ref().map(|(rate, _)| *rate)
    }

    #[test]
    fn the_most_specific_entity_wins_in_kafkas_order() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let q = Quotas::load(&catalog).unwrap();
        assert!(!q.any());
        let named = |s: &str| Some(Name::Named(s.into()));
        let levels = [
            Entity { user: None, client_id: Some(Name::Default) },
            Entity { user: None, client_id: named("app") },
            Entity { user: Some(Name::Default), client_id: None },
            Entity { user: Some(Name::Default), client_id: Some(Name::Default) },
            Entity { user: Some(Name::Default), client_id: named("app") },
            Entity { user: named("alice"), client_id: None },
            Entity { user: named("alice"), client_id: Some(Name::Default) },
            Entity { user: named("alice"), client_id: named("app") },
        ];
        // Each level added over the ones before it takes over.
        for (i, e) in levels.iter().enumerate() {
            set(&q, &catalog, e.clone(), Kind::Produce, (i + 1) as f64 * 100.0);
            assert_eq!(rate(&q.resolve("alice", "app", None), Kind::Produce), Some((i + 1) as f64 * 100.0), "{e:?}");
        }
        assert!(q.any());
        // Other keys and other users fall through to their own levels.
        assert_eq!(rate(&q.resolve("alice", "app", None), Kind::Fetch), None);
        assert_eq!(rate(&q.resolve("bob", "other", None), Kind::Produce), Some(400.0), "bob: <default> user, <default> client");
        // Durable: a reload resolves the same.
        let again = Quotas::load(&catalog).unwrap();
        assert_eq!(rate(&again.resolve("alice", "app", None), Kind::Produce), Some(800.0));
        assert_eq!(again.describe(&[], false).len(), levels.len());
    }

    #[test]
    fn a_users_quota_is_shared_by_its_clients_and_a_default_is_per_user() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let q = Quotas::load(&catalog).unwrap();
        set(&q, &catalog, user("alice"), Kind::Produce, 1000.0);
        set(&q, &catalog, Entity { user: Some(Name::Default), client_id: None }, Kind::Produce, 1000.0);
        let (a1, a2) = (q.resolve("alice", "one", None), q.resolve("alice", "two", None));
        let (b, c) = (q.resolve("bob", "one", None), q.resolve("carol", "one", None));
        // After the buckets were made: they start full at their making.
        let now = Instant::now();
        // A second's burst, then debt: alice's two clients share one bucket.
        assert_eq!(a1.charge(Kind::Produce, 1000.0, now), Duration::ZERO);
        assert_eq!(a2.charge(Kind::Produce, 500.0, now), Duration::from_millis(500));
        // The default gives bob and carol a bucket each.
        assert_eq!(b.charge(Kind::Produce, 1000.0, now), Duration::ZERO);
        assert_eq!(c.charge(Kind::Produce, 1000.0, now), Duration::ZERO);
        // The debt is repaid at the rate.
        assert_eq!(a1.debt(Kind::Produce, now + Duration::from_millis(250)), Duration::from_millis(250));
        assert_eq!(a1.debt(Kind::Produce, now + Duration::from_millis(500)), Duration::ZERO);
    }

    #[test]
    fn a_debt_is_at_most_a_window() {
        let mut b = Bucket { tokens: 0.0, at: Instant::now() };
        let now = b.at;
        assert_eq!(b.charge(1e9, 1000.0, now), WINDOW, "a huge charge waits a window, not a million seconds");
        assert_eq!(b.charge(0.0, 1000.0, now + WINDOW), Duration::ZERO);
    }

    #[test]
    fn charges_over_time_admit_the_rate() {
        // A client that waits out each throttle gets the quota's rate.
        let mut b = Bucket { tokens: 0.0, at: Instant::now() };
        let start = b.at;
        let mut now = start;
        let mut sent = 0.0;
        while now < start + Duration::from_secs(10) {
            let t = b.charge(4096.0, 100_000.0, now);
            sent += 4096.0;
            now += t + Duration::from_millis(1);
        }
        let rate = sent / now.duration_since(start).as_secs_f64();
        assert!((rate - 100_000.0).abs() / 100_000.0 < 0.01, "{rate}");
    }

    #[test]
    fn changes_are_checked_removed_and_bump_the_generation() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let q = Quotas::load(&catalog).unwrap();
        assert!(Quotas::check(&[(Kind::Produce, Some(1.5))]).is_some(), "byte rates are whole");
        assert!(Quotas::check(&[(Kind::Produce, Some(0.0))]).is_some());
        assert!(Quotas::check(&[(Kind::Request, Some(f64::NAN))]).is_some());
        assert!(Quotas::check(&[(Kind::Request, Some(1.5)), (Kind::Request, None)]).is_some(), "a key twice");
        assert!(Quotas::check(&[(Kind::Request, Some(1.5)), (Kind::Fetch, None)]).is_none());
        let first = q.resolve("alice", "x", None);
        set(&q, &catalog, user("alice"), Kind::Request, 25.0);
        let second = q.resolve("alice", "x", Some(&first));
        assert_eq!(rate(&second, Kind::Request), Some(0.25e9), "re-resolved after a change");
        assert_eq!(rate(&q.resolve("alice", "x", Some(&second)), Kind::Request), Some(0.25e9));
        q.alter(&catalog, &[(user("alice"), vec![(Kind::Request, None)])]).unwrap();
        assert!(!q.any(), "the last value removed removes the entity");
        assert!(Quotas::load(&catalog).unwrap().describe(&[], false).is_empty());
    }

    #[test]
    fn describe_filters_as_kafka_does() {
        let q = Quotas::in_memory();
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let pair = Entity { user: Some(Name::Named("alice".into())), client_id: Some(Name::Default) };
        set(&q, &catalog, user("alice"), Kind::Produce, 10.0);
        set(&q, &catalog, pair.clone(), Kind::Produce, 10.0);
        set(&q, &catalog, Entity { user: Some(Name::Default), client_id: None }, Kind::Fetch, 10.0);
        let names = |f: &[(String, Match)], strict| q.describe(f, strict).into_iter().map(|(e, _)| e).collect::<Vec<_>>();
        assert_eq!(names(&[(USER.into(), Match::Exact("alice".into()))], true), vec![user("alice")]);
        assert_eq!(names(&[(USER.into(), Match::Exact("alice".into()))], false).len(), 2);
        assert_eq!(names(&[(USER.into(), Match::Default)], false), vec![Entity { user: Some(Name::Default), client_id: None }]);
        assert_eq!(names(&[(USER.into(), Match::Any)], true).len(), 2);
        assert_eq!(names(&[(CLIENT_ID.into(), Match::Any)], false), vec![pair]);
        assert!(names(&[(CLIENT_ID.into(), Match::Exact("x".into()))], false).is_empty());
    }

    #[test]
    fn entities_are_refused_as_kafka_refuses_them() {
        assert!(Entity::from_wire([]).is_err());
        assert!(Entity::from_wire([(USER, Some("a")), (USER, Some("b"))]).is_err());
        assert!(Entity::from_wire([("group", Some("a"))]).is_err());
        assert!(Entity::from_wire([(IP, Some("1.2.3.4"))]).is_err());
        assert!(Entity::from_wire([(USER, Some("a\0b"))]).is_err());
        assert!(Entity::from_wire([(USER, Some(""))]).is_err(), "empty names, as Kafka");
        assert!(Entity::from_wire([(CLIENT_ID, Some(""))]).is_err());
        let e = Entity::from_wire([(CLIENT_ID, None), (USER, Some("a"))]).unwrap();
        assert_eq!(e.to_wire(), vec![(USER, Some("a")), (CLIENT_ID, None)]);
        assert_ne!(e.key(), Entity::from_wire([(USER, Some("a")), (CLIENT_ID, Some("b"))]).unwrap().key());
    }
}
