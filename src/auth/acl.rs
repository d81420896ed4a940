//! Kafka's ACL model and the authorizer that checks it.
//!
//! An ACL says: `principal` from `host` is ALLOWed or DENYed `operation`
//! on the resources a pattern names. Patterns are LITERAL (one name, or
//! `*` for every name of the type) or PREFIXED (every name starting with
//! it: `app.codestore.` grants a branch of the topic tree). The numbers
//! are Kafka's wire numbers (`ResourceType`, `PatternType`, `AclOperation`,
//! `AclPermissionType`).
//!
//! A check, as Kafka's authorizer makes it:
//! 1. super users may do everything;
//! 2. a matching DENY (for the operation or ALL) refuses;
//! 3. a matching ALLOW for the operation or ALL permits; DESCRIBE is also
//!    permitted by READ, WRITE, DELETE or ALTER, and DESCRIBE_CONFIGS by
//!    ALTER_CONFIGS;
//! 4. a resource no ACL names at all is permitted only if
//!    `allow_everyone_if_no_acl_found`.
//!
//! The cost of a check does not grow with the number of ACLs: literal
//! patterns are found by name in a hash map, prefixed ones by trying only
//! the prefix lengths some ACL of the type has. The index is an immutable
//! snapshot replaced on every change (after the catalog write), so checks
//! take no lock but the snapshot's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use super::KafkaPrincipal;
use crate::meta::{Catalog, MetaError};

pub const CLUSTER_NAME: &str = "kafka-cluster";

macro_rules! wire_enum {
    ($name:ident { $( $variant:ident = $n:literal ),* $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $( $variant ),* }
        impl $name {
            pub fn code(self) -> i8 {
                match self { $( $name::$variant => $n ),* }
            }
            pub fn from_code(n: i8) -> Option<$name> {
                match n { $( $n => Some($name::$variant), )* _ => None }
            }
        }
    };
}

wire_enum!(ResourceType { Topic = 2, Group = 3, Cluster = 4, TransactionalId = 5 });
wire_enum!(PatternType { Literal = 3, Prefixed = 4 });
wire_enum!(Operation {
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
});
wire_enum!(Permission { Deny = 2, Allow = 3 });

/// Kafka's wire number for "any" in filters.
pub const ANY: i8 = 1;
/// PatternType MATCH in filters: the ACLs that apply to a named resource.
pub const MATCH: i8 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Acl {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    /// `User:alice`, or `User:*` for every principal.
    pub principal: String,
    /// An address, or `*` for every host.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl Acl {
    /// Why Kafka would refuse to create this ACL, if it would.
    pub fn invalid(&self) -> Option<&'static str> {
        if self.name.is_empty() {
            return Some("the resource name is empty");
        }
        if self.pattern == PatternType::Prefixed && self.name == "*" {
            return Some("a prefixed pattern cannot be the wildcard");
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER_NAME {
            return Some("the cluster resource is named kafka-cluster");
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => return Some("the principal is not TYPE:NAME"),
        }
        if self.host.is_empty() {
            return Some("the host is empty");
        }
        // The catalog key joins the fields with NUL.
        if [&self.name, &self.principal, &self.host].iter().any(|f| f.contains('\0')) {
            return Some("a field holds a NUL character");
        }
        None
    }

    /// The ACL's identity: every field, so two ACLs with one key are one
    /// ACL (the catalog's key, and in cluster mode the etcd key's).
    pub fn key(&self) -> String {
        // Fields joined by NUL, which no field may hold (names are
        // checked on the wire, principals and hosts never carry it).
        format!(
            "acl/{}\0{}\0{}\0{}\0{}\0{}\0{}",
            self.resource_type.code(),
            self.pattern.code(),
            self.name,
            self.principal,
            self.host,
            self.operation.code(),
            self.permission.code()
        )
    }
}

/// An ACL filter (DescribeAcls, DeleteAcls), in wire numbers: `ANY` (1)
/// matches every value; `None` strings match every string.
#[derive(Debug, Clone)]
pub struct Filter {
    pub resource_type: i8,
    pub name: Option<String>,
    pub pattern: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission: i8,
}

impl Filter {
    /// A filter from the wire's fields (DescribeAcls and DeleteAcls carry
    /// the same seven).
    pub fn from_wire(resource_type: i8, name: Option<&str>, pattern: i8, principal: Option<&str>, host: Option<&str>, operation: i8, permission: i8) -> Filter {
        Filter { resource_type, name: name.map(str::to_owned), pattern, principal: principal.map(str::to_owned), host: host.map(str::to_owned), operation, permission }
    }

    /// Why Kafka would refuse the filter, if it would: unknown numbers.
    pub fn invalid(&self) -> Option<&'static str> {
        let known = |n: i8, f: fn(i8) -> bool| n == ANY || f(n);
        if !known(self.resource_type, |n| ResourceType::from_code(n).is_some()) {
            return Some("unknown resource type");
        }
        if !(known(self.pattern, |n| PatternType::from_code(n).is_some()) || self.pattern == MATCH) {
            return Some("unknown pattern type");
        }
        if !known(self.operation, |n| Operation::from_code(n).is_some()) {
            return Some("unknown operation");
        }
        if !known(self.permission, |n| Permission::from_code(n).is_some()) {
            return Some("unknown permission type");
        }
        None
    }

    pub fn matches(&self, a: &Acl) -> bool {
        let num = |f: i8, v: i8| f == ANY || f == v;
        let name_ok = match (&self.name, self.pattern) {
            (None, _) => true,
            // MATCH: the ACLs that apply to this name.
            (Some(n), MATCH) => match a.pattern {
                PatternType::Literal => a.name == *n || a.name == "*",
                PatternType::Prefixed => n.starts_with(&a.name),
            },
            (Some(n), _) => a.name == *n,
        };
        let pattern_ok = self.pattern == ANY || self.pattern == MATCH || self.pattern == a.pattern.code();
        num(self.resource_type, a.resource_type.code())
            && name_ok
            && pattern_ok
            && self.principal.as_ref().is_none_or(|p| *p == a.principal)
            && self.host.as_ref().is_none_or(|h| *h == a.host)
            && num(self.operation, a.operation.code())
            && num(self.permission, a.permission.code())
    }
}

/// The ACLs of one pattern (a resource type and a name).
type Entries = Vec<Acl>;

/// Every ACL, indexed for checks.
#[derive(Default)]
struct Index {
    all: BTreeSet<Acl>,
    /// By resource type, then pattern name: looked up by `&str`, no
    /// allocation on a check.
    literal: HashMap<ResourceType, HashMap<String, Entries>>,
    prefixed: HashMap<ResourceType, HashMap<String, Entries>>,
    /// Per resource type, the lengths of its prefixed patterns.
    prefix_lengths: HashMap<ResourceType, BTreeSet<usize>>,
}

impl Index {
    fn build(all: BTreeSet<Acl>) -> Index {
        let mut ix = Index::default();
        for a in &all {
            let by_name = match a.pattern {
                PatternType::Literal => &mut ix.literal,
                PatternType::Prefixed => {
                    ix.prefix_lengths.entry(a.resource_type).or_default().insert(a.name.len());
                    &mut ix.prefixed
                }
            };
            by_name.entry(a.resource_type).or_default().entry(a.name.clone()).or_default().push(a.clone());
        }
        ix.all = all;
        ix
    }

    /// Every ACL whose pattern names `name`.
    fn applying<'a>(&'a self, rt: ResourceType, name: &'a str) -> impl Iterator<Item = &'a Acl> + 'a {
        let literal = self.literal.get(&rt).into_iter().flat_map(move |m| [name, "*"].into_iter().filter_map(move |n| m.get(n))).flatten();
        let lengths = self.prefix_lengths.get(&rt).into_iter().flatten().copied();
        let prefixed = self.prefixed.get(&rt).into_iter().flat_map(move |m| lengths.clone().filter(move |&l| l <= name.len() && name.is_char_boundary(l)).filter_map(move |l| m.get(&name[..l]))).flatten();
        literal.chain(prefixed)
    }
}

/// What a check asks.
pub struct Request<'a> {
    pub principal: &'a KafkaPrincipal,
    pub host: &'a str,
    pub operation: Operation,
    pub resource_type: ResourceType,
    pub name: &'a str,
}

pub struct Authorizer {
    enabled: bool,
    super_users: Vec<KafkaPrincipal>,
    allow_if_no_acl: bool,
    index: RwLock<Arc<Index>>,
    /// Held by a change; in cluster mode, the revision of the cluster's
    /// ACLs the index holds (0 until it follows the cluster).
    writing: Mutex<i64>,
    /// Cluster mode: where ACLs live (etcd); the index follows it.
    store: std::sync::OnceLock<Arc<dyn AclStore>>,
}

/// The cluster's ACLs, when they are not the node's own (cluster mode:
/// etcd, so that an ACL made through any broker holds at every broker).
pub trait AclStore: Send + Sync {
    /// Makes every ACL of `add` exist and none of `remove`, cluster-wide,
    /// and returns once this node's view of the cluster has the change:
    /// the cluster's ACLs then, and the revision they are at. Blocking.
    fn change(&self, add: &[Acl], remove: &[Acl]) -> Result<(i64, BTreeSet<Acl>), String>;
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("{0}")]
    Invalid(&'static str),
    #[error("the catalog write failed: {0}")]
    Storage(String),
    #[error("the cluster's ACLs could not be changed: {0}")]
    Cluster(String),
}

impl Authorizer {
    /// Loads the ACLs. `enabled` false: every check passes (Kafka without
    /// an authorizer), but the ACL APIs still work.
    pub fn load(catalog: &Catalog, enabled: bool, super_users: Vec<KafkaPrincipal>, allow_if_no_acl: bool) -> Result<Authorizer, MetaError> {
        let all: BTreeSet<Acl> = catalog.acls()?.into_iter().collect();
        Ok(Authorizer { enabled, super_users, allow_if_no_acl, index: RwLock::new(Arc::new(Index::build(all))), writing: Mutex::new(0), store: Default::default() })
    }

    /// An authorizer over `acls` held in memory only (tests, benchmarks).
    pub fn in_memory(acls: Vec<Acl>, super_users: Vec<KafkaPrincipal>, allow_if_no_acl: bool) -> Authorizer {
        Authorizer { enabled: true, super_users, allow_if_no_acl, index: RwLock::new(Arc::new(Index::build(acls.into_iter().collect()))), writing: Mutex::new(0), store: Default::default() }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Cluster mode: ACLs live in `store` from now on, and this node's
    /// are the cluster's at `revision` (`acls`), replacing the catalog's.
    /// Set once, before the node serves.
    pub fn set_store(&self, store: Arc<dyn AclStore>, revision: i64, acls: BTreeSet<Acl>) {
        if self.store.set(store).is_err() {
            panic!("the ACL store is set once");
        }
        self.follow(revision, acls);
    }

    /// Cluster mode: the cluster's ACLs at `revision`, taken unless the
    /// index already holds a later revision's (the node's own change and
    /// its view's follower may arrive out of order).
    pub fn follow(&self, revision: i64, acls: BTreeSet<Acl>) {
        let mut at = self.writing.lock().expect("acl writer lock");
        if revision > *at {
            *at = revision;
            *self.index.write().expect("acl index lock") = Arc::new(Index::build(acls));
        }
    }

    pub fn is_super_user(&self, p: &KafkaPrincipal) -> bool {
        self.super_users.iter().any(|s| s == p)
    }

    fn snapshot(&self) -> Arc<Index> {
        self.index.read().expect("acl index lock").clone()
    }

    pub fn authorize(&self, r: &Request<'_>) -> bool {
        if !self.enabled || self.is_super_user(r.principal) {
            return true;
        }
        let ix = self.snapshot();
        let mut any = false;
        let mut allowed = false;
        for a in ix.applying(r.resource_type, r.name) {
            any = true;
            if !names(&a.principal, r.principal) || !(a.host == "*" || a.host == r.host) {
                continue;
            }
            match a.permission {
                Permission::Deny if a.operation == r.operation || a.operation == Operation::All => return false,
                Permission::Deny => {}
                Permission::Allow => allowed |= a.operation == Operation::All || a.operation == r.operation || implies(a.operation, r.operation),
            }
        }
        allowed || (!any && self.allow_if_no_acl)
    }

    /// May the principal do `operation` on some resource of the type
    /// (Kafka's `authorizeByResourceType`: how an idempotent producer with
    /// WRITE on any topic gets IDEMPOTENT_WRITE)? An ALLOW for it on any
    /// pattern counts, unless a DENY covers every name of the type.
    pub fn authorize_any(&self, principal: &KafkaPrincipal, host: &str, operation: Operation, resource_type: ResourceType) -> bool {
        if !self.enabled || self.is_super_user(principal) {
            return true;
        }
        let ix = self.snapshot();
        let applies = |a: &Acl| a.resource_type == resource_type && names(&a.principal, principal) && (a.host == "*" || a.host == host) && (a.operation == operation || a.operation == Operation::All);
        let denied_everywhere = ix.all.iter().any(|a| applies(a) && a.permission == Permission::Deny && (a.name == "*" && a.pattern == PatternType::Literal));
        if denied_everywhere {
            return false;
        }
        let none_of_type = !ix.all.iter().any(|a| a.resource_type == resource_type);
        (none_of_type && self.allow_if_no_acl) || ix.all.iter().any(|a| applies(a) && a.permission == Permission::Allow)
    }

    /// The ACLs a filter matches.
    pub fn describe(&self, f: &Filter) -> Vec<Acl> {
        self.snapshot().all.iter().filter(|a| f.matches(a)).cloned().collect()
    }

    /// Creates ACLs, each on its own: one answer each, in order. Durable
    /// before the new ACLs are checked. Blocking.
    pub fn create(&self, catalog: &Catalog, acls: &[Acl]) -> Vec<Result<(), AclError>> {
        if let Some(store) = self.store.get() {
            let results: Vec<Result<(), AclError>> = acls.iter().map(|a| a.invalid().map_or(Ok(()), |why| Err(AclError::Invalid(why)))).collect();
            let valid: Vec<Acl> = acls.iter().zip(&results).filter(|(_, r)| r.is_ok()).map(|(a, _)| a.clone()).collect();
            return match self.change(store, &valid, &[]) {
                Ok(()) => results,
                Err(e) => results.into_iter().map(|r| r.and(Err(e.clone()))).collect(),
            };
        }
        let _w = self.writing.lock().expect("acl writer lock");
        let mut all = self.snapshot().all.clone();
        let mut results: Vec<Result<(), AclError>> = Vec::with_capacity(acls.len());
        let mut added = Vec::new();
        for a in acls {
            if let Some(why) = a.invalid() {
                results.push(Err(AclError::Invalid(why)));
                continue;
            }
            if all.insert(a.clone()) {
                added.push(a.clone());
            }
            results.push(Ok(()));
        }
        if let Err(e) = catalog.put_acls(&added.iter().map(|a| (a.key(), Some(a))).collect::<Vec<_>>()) {
            return results.into_iter().map(|r| r.and(Err(AclError::Storage(e.to_string())))).collect();
        }
        *self.index.write().expect("acl index lock") = Arc::new(Index::build(all));
        results
    }

    /// Deletes what each filter matches: per filter, the ACLs it removed.
    /// Blocking.
    pub fn delete(&self, catalog: &Catalog, filters: &[Filter]) -> Result<Vec<Vec<Acl>>, AclError> {
        if let Some(store) = self.store.get() {
            // What the filters match of the cluster's ACLs as this node
            // sees them; one made meanwhile at another node and not seen
            // yet stays.
            let all = self.snapshot().all.clone();
            let out: Vec<Vec<Acl>> = filters.iter().map(|f| all.iter().filter(|a| f.matches(a)).cloned().collect()).collect();
            let removed: Vec<Acl> = out.iter().flatten().cloned().collect::<BTreeSet<Acl>>().into_iter().collect();
            self.change(store, &[], &removed)?;
            return Ok(out);
        }
        let _w = self.writing.lock().expect("acl writer lock");
        let mut all = self.snapshot().all.clone();
        let mut out = Vec::with_capacity(filters.len());
        let mut removed = Vec::new();
        for f in filters {
            let hit: Vec<Acl> = all.iter().filter(|a| f.matches(a)).cloned().collect();
            for a in &hit {
                all.remove(a);
                removed.push(a.key());
            }
            out.push(hit);
        }
        catalog.put_acls(&removed.into_iter().map(|k| (k, None)).collect::<Vec<_>>()).map_err(|e| AclError::Storage(e.to_string()))?;
        *self.index.write().expect("acl index lock") = Arc::new(Index::build(all));
        Ok(out)
    }

    /// A change through the cluster's store; the index then holds it.
    fn change(&self, store: &Arc<dyn AclStore>, add: &[Acl], remove: &[Acl]) -> Result<(), AclError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        let (revision, acls) = store.change(add, remove).map_err(AclError::Cluster)?;
        self.follow(revision, acls);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.snapshot().all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Does an ACL's principal (`Type:name`, or `Type:*`) name `p`?
fn names(acl_principal: &str, p: &KafkaPrincipal) -> bool {
    acl_principal.split_once(':').is_some_and(|(kind, name)| kind == p.kind && (name == "*" || name == p.name))
}

/// Operations an ALLOW of `granted` also permits (Kafka's implied ones).
fn implies(granted: Operation, asked: Operation) -> bool {
    use Operation::*;
    match asked {
        Describe => matches!(granted, Read | Write | Delete | Alter),
        DescribeConfigs => granted == AlterConfigs,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(rt: ResourceType, name: &str, pattern: PatternType, principal: &str, op: Operation, perm: Permission) -> Acl {
        Acl { resource_type: rt, name: name.into(), pattern, principal: principal.into(), host: "*".into(), operation: op, permission: perm }
    }

    fn check(a: &Authorizer, who: &str, op: Operation, rt: ResourceType, name: &str) -> bool {
        a.authorize(&Request { principal: &KafkaPrincipal::user(who), host: "10.0.0.1", operation: op, resource_type: rt, name })
    }

    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;

    #[test]
    fn kafkas_rules() {
        let a = Authorizer::in_memory(
            vec![
                acl(Topic, "app.codestore.", Prefixed, "User:alice", Write, Allow),
                acl(Topic, "app.codestore.secret", Literal, "User:alice", All, Deny),
                acl(Topic, "logs", Literal, "User:*", Read, Allow),
                acl(Group, "*", Literal, "User:alice", Read, Allow),
                acl(Topic, "app.billing.invoices", Literal, "User:bob", AlterConfigs, Allow),
                Acl { host: "10.0.0.2".into(), ..acl(Topic, "hosted", Literal, "User:alice", Read, Allow) },
            ],
            vec![KafkaPrincipal::user("root")],
            false,
        );
        // A prefixed grant covers the branch, and implies DESCRIBE.
        assert!(check(&a, "alice", Write, Topic, "app.codestore.commits"));
        assert!(check(&a, "alice", Describe, Topic, "app.codestore.commits"));
        assert!(!check(&a, "alice", Read, Topic, "app.codestore.commits"), "WRITE does not imply READ");
        assert!(!check(&a, "alice", Write, Topic, "app.codestorex"), "a prefix is a prefix of the name, not of the branch");
        assert!(!check(&a, "bob", Write, Topic, "app.codestore.commits"));
        // DENY wins over ALLOW.
        assert!(!check(&a, "alice", Write, Topic, "app.codestore.secret"));
        // The wildcard principal and the wildcard name.
        assert!(check(&a, "anyone", Read, Topic, "logs") && check(&a, "alice", Read, Group, "g1"));
        assert!(check(&a, "bob", DescribeConfigs, Topic, "app.billing.invoices"));
        // Host.
        assert!(!check(&a, "alice", Read, Topic, "hosted"));
        // Nothing names this topic: refused (allow_everyone_if_no_acl_found off).
        assert!(!check(&a, "alice", Read, Topic, "unnamed"));
        // Super users may do everything.
        assert!(check(&a, "root", Delete, Cluster, CLUSTER_NAME));
        let open = Authorizer::in_memory(vec![acl(Topic, "named", Literal, "User:bob", Read, Allow)], vec![], true);
        assert!(check(&open, "alice", Read, Topic, "unnamed"), "no ACL names it: allowed to everyone");
        assert!(!check(&open, "alice", Read, Topic, "named"), "named by an ACL for someone else: refused");
    }

    #[test]
    fn filters_match_as_kafkas_do() {
        let acls = vec![
            acl(Topic, "app.", Prefixed, "User:alice", Write, Allow),
            acl(Topic, "app.x", Literal, "User:bob", Read, Allow),
            acl(Topic, "*", Literal, "User:carol", Describe, Allow),
            acl(Group, "g", Literal, "User:alice", Read, Allow),
        ];
        let f = |rt: i8, name: Option<&str>, pattern: i8| Filter { resource_type: rt, name: name.map(str::to_owned), pattern, principal: None, host: None, operation: ANY, permission: ANY };
        let hits = |filter: Filter| acls.iter().filter(|a| filter.matches(a)).count();
        assert_eq!(hits(f(ANY, None, ANY)), 4);
        assert_eq!(hits(f(Topic.code(), None, ANY)), 3);
        assert_eq!(hits(f(Topic.code(), Some("app.x"), MATCH)), 3, "literal, wildcard and prefix all apply");
        assert_eq!(hits(f(Topic.code(), Some("app.x"), Literal.code())), 1);
        assert_eq!(hits(f(Topic.code(), Some("app."), Prefixed.code())), 1);
        assert!(f(9, None, ANY).invalid().is_some() && f(ANY, None, 7).invalid().is_some());
    }

    #[test]
    fn acls_survive_reopen_and_deletes_remove_what_they_match() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path()).unwrap();
        let a = Authorizer::load(&catalog, true, vec![], false).unwrap();
        let r = a.create(
            &catalog,
            &[acl(Topic, "t", Literal, "User:alice", Read, Allow), acl(Cluster, "other", Literal, "User:alice", Alter, Allow), acl(Topic, "t", Literal, "alice", Read, Allow), acl(Group, "g\0x", Literal, "User:alice", Read, Allow)],
        );
        assert!(r[0].is_ok() && r[1].is_err() && r[2].is_err() && r[3].is_err());
        assert!(check(&a, "alice", Read, Topic, "t"));
        drop(a);
        let a = Authorizer::load(&catalog, true, vec![], false).unwrap();
        assert_eq!(a.len(), 1);
        let gone = a.delete(&catalog, &[Filter { resource_type: Topic.code(), name: Some("t".into()), pattern: Literal.code(), principal: None, host: None, operation: ANY, permission: ANY }]).unwrap();
        assert_eq!(gone[0].len(), 1);
        assert!(!check(&a, "alice", Read, Topic, "t"));
        assert_eq!(Authorizer::load(&catalog, true, vec![], false).unwrap().len(), 0);
    }
}
