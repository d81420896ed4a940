//! The user store: every user's SCRAM credentials, one per mechanism,
//! durable in the catalog (`scram/<user>`), the one place passwords are
//! checked whichever way they arrive (SASL SCRAM, SASL PLAIN).
//!
//! Readers take the current snapshot (an `Arc` swapped under a short lock)
//! and never wait for a writer's catalog write. Writers are serialised by
//! their own lock: each reads the snapshot, writes the catalog durably,
//! and only then publishes the new snapshot, so no client authenticates
//! with a credential a crash could take back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use super::scram::{self, Credential, Mechanism};
use crate::meta::{Catalog, MetaError};

/// A user's credentials, one per mechanism.
pub type Credentials = BTreeMap<Mechanism, Credential>;
pub type Users = HashMap<String, Credentials>;

/// The cluster's users, when they are not the node's own (cluster mode:
/// etcd, so a user made through any broker authenticates at every one).
pub trait UserDirectory: Send + Sync {
    /// Applies each group (one user's changes, all or nothing) against
    /// the cluster's current credentials of its user, and returns once
    /// this node's view has them: one answer per group, and the cluster's
    /// users then with the revision they are at. `Err`: the cluster did
    /// not answer (groups before the failure may be done). Blocking.
    fn alter(&self, groups: &[Vec<Alteration>]) -> Result<(Vec<Result<(), AlterError>>, i64, Users), String>;
    /// Creates each user the cluster does not have (never overwriting
    /// one it has), and returns once this node's view has them: the names
    /// it took. Blocking.
    fn hand_over(&self, users: &Users) -> Result<std::collections::BTreeSet<String>, String>;
}

/// One user's credentials after `group` (all of whose changes name
/// `user`): `None` when none are left.
pub fn altered(user: &str, current: Option<Credentials>, group: &[Alteration]) -> Result<Option<Credentials>, AlterError> {
    let mut users: Users = current.map(|c| (user.to_owned(), c)).into_iter().collect();
    for c in group {
        debug_assert_eq!(c.user(), user);
        apply(&mut users, c)?;
    }
    Ok(users.remove(user))
}

pub struct UserStore {
    users: RwLock<Arc<Users>>,
    /// Held by a writer across its read, catalog write and publish; in
    /// cluster mode, the revision of the cluster's users held.
    writing: Mutex<i64>,
    /// Cluster mode: where users live (etcd); the store follows it.
    directory: std::sync::OnceLock<Arc<dyn UserDirectory>>,
    /// Seeds the decoy salts of unknown users (see `scram.rs`); fresh each
    /// start.
    decoy: Vec<u8>,
    /// A credential an unknown user's PLAIN password is checked against,
    /// so that an unknown name costs the same PBKDF2 as a known one.
    decoy_credential: Credential,
    /// Bumped whenever a credential changes: what a cache of verified
    /// passwords checks it still holds.
    generation: std::sync::atomic::AtomicU64,
}

/// A user's mechanisms and their iteration counts.
pub type Described = Vec<(Mechanism, u32)>;

/// One change AlterUserScramCredentials asks for.
#[derive(Debug, Clone)]
pub enum Alteration {
    Upsert { user: String, mechanism: Mechanism, credential: Credential },
    Delete { user: String, mechanism: Mechanism },
}

impl Alteration {
    pub fn user(&self) -> &str {
        match self {
            Alteration::Upsert { user, .. } | Alteration::Delete { user, .. } => user,
        }
    }
}

fn apply(users: &mut Users, c: &Alteration) -> Result<(), AlterError> {
    match c {
        Alteration::Upsert { user, mechanism, credential } => {
            if user.is_empty() {
                return Err(AlterError::Unacceptable("Username must not be empty".into()));
            }
            if credential.iterations < scram::MIN_ITERATIONS || credential.iterations > scram::MAX_ITERATIONS {
                return Err(AlterError::Unacceptable(format!("Iterations {} must be between {} and {} for {mechanism}", credential.iterations, scram::MIN_ITERATIONS, scram::MAX_ITERATIONS)));
            }
            if !credential.fits(*mechanism) {
                return Err(AlterError::Unacceptable(format!("a {mechanism} credential needs a salt and {}-byte keys", mechanism.key_len())));
            }
            users.entry(user.clone()).or_default().insert(*mechanism, credential.clone());
        }
        Alteration::Delete { user, mechanism } => {
            let creds = users.get_mut(user).ok_or(AlterError::NotFound)?;
            creds.remove(mechanism).ok_or(AlterError::NotFound)?;
            if creds.is_empty() {
                users.remove(user);
            }
        }
    }
    Ok(())
}

/// Why a change was refused, as Kafka names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlterError {
    /// RESOURCE_NOT_FOUND: deleting a credential that does not exist.
    #[error("attempt to delete a user credential that does not exist")]
    NotFound,
    /// UNACCEPTABLE_CREDENTIAL.
    #[error("{0}")]
    Unacceptable(String),
    /// The cluster (etcd) did not take the change in time: retriable.
    #[error("the cluster's users could not be changed: {0}")]
    Unavailable(String),
}

impl UserStore {
    pub fn empty() -> UserStore {
        UserStore::from_users(Users::new())
    }

    fn from_users(users: Users) -> UserStore {
        let decoy_credential = Credential::from_password(Mechanism::Sha512, &scram::random_bytes(16), scram::MIN_ITERATIONS);
        UserStore { users: RwLock::new(Arc::new(users)), writing: Mutex::new(0), directory: Default::default(), decoy: scram::random_bytes(32), decoy_credential, generation: Default::default() }
    }

    /// A store of `(user, password)` with credentials for every mechanism,
    /// held in memory only (tests, the fuzz target, the benchmark).
    pub fn in_memory(users: &[(&str, &[u8])]) -> UserStore {
        UserStore::from_users(users.iter().map(|(u, p)| (u.to_string(), Mechanism::ALL.into_iter().map(|m| (m, Credential::from_password(m, p, scram::MIN_ITERATIONS))).collect())).collect())
    }

    pub fn load(catalog: &Catalog) -> Result<UserStore, MetaError> {
        Ok(UserStore::from_users(catalog.scram_users()?.into_iter().collect()))
    }

    fn snapshot(&self) -> Arc<Users> {
        self.users.read().expect("user store lock").clone()
    }

    pub fn decoy_secret(&self) -> &[u8] {
        &self.decoy
    }

    /// The user's credential for `mech`.
    pub fn scram(&self, user: &str, mech: Mechanism) -> Option<Credential> {
        self.snapshot().get(user)?.get(&mech).cloned()
    }

    /// Does `password` belong to `user`? Checked against the user's
    /// strongest credential; an unknown user costs the same PBKDF2. Slow
    /// by design (thousands of HMACs): run it off the async workers.
    pub fn verify_password(&self, user: &str, password: &[u8]) -> bool {
        let users = self.snapshot();
        match users.get(user).and_then(|m| m.iter().next_back()) {
            Some((mech, cred)) => cred.verify_password(*mech, password),
            None => {
                let _ = self.decoy_credential.verify_password(Mechanism::Sha512, password);
                false
            }
        }
    }

    /// Users and their mechanisms with iteration counts (`None`: no such
    /// user), by name; `None`: every user.
    pub fn describe(&self, users: Option<&[String]>) -> Vec<(String, Option<Described>)> {
        let snap = self.snapshot();
        let info = |creds: &Credentials| creds.iter().map(|(m, c)| (*m, c.iterations)).collect::<Vec<_>>();
        match users {
            Some(names) => names.iter().map(|n| (n.clone(), snap.get(n).map(info))).collect(),
            None => {
                let mut all: Vec<_> = snap.iter().map(|(n, c)| (n.clone(), Some(info(c)))).collect();
                all.sort_by(|a, b| a.0.cmp(&b.0));
                all
            }
        }
    }

    /// Applies groups of changes: each group all or nothing (Kafka answers
    /// AlterUserScramCredentials per user, so a user's changes are one
    /// group), one answer per group, in order. Blocking (a durable catalog
    /// write).
    pub fn alter(&self, catalog: &Catalog, groups: &[Vec<Alteration>]) -> Vec<Result<(), AlterError>> {
        if let Some(directory) = self.directory.get() {
            return match directory.alter(groups) {
                Ok((results, revision, users)) => {
                    self.follow(revision, users);
                    results
                }
                Err(e) => groups.iter().map(|_| Err(AlterError::Unavailable(e.clone()))).collect(),
            };
        }
        let _w = self.writing.lock().expect("user store writer lock");
        let mut users: Users = (*self.snapshot()).clone();
        let mut touched = std::collections::BTreeSet::new();
        let mut results: Vec<Result<(), AlterError>> = groups
            .iter()
            .map(|group| {
                let mut trial = users.clone();
                for c in group {
                    apply(&mut trial, c)?;
                }
                for c in group {
                    touched.insert(c.user().to_owned());
                }
                users = trial;
                Ok(())
            })
            .collect();
        let empty = BTreeMap::new();
        for user in &touched {
            if let Err(e) = catalog.put_scram_user(user, users.get(user).unwrap_or(&empty)) {
                tracing::error!(error = %e, "writing SCRAM credentials to the catalog failed");
                // Nothing is published: the changes of this call are
                // refused together (the catalog may hold some; the next
                // start reads them).
                for r in results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(AlterError::Unacceptable(format!("the catalog write failed: {e}")));
                }
                return results;
            }
        }
        *self.users.write().expect("user store lock") = Arc::new(users);
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        results
    }

    /// Cluster mode: users live in `directory` from now on, and this
    /// node's are the cluster's at `revision`. Set once, before the node
    /// serves.
    pub fn set_directory(&self, directory: Arc<dyn UserDirectory>, revision: i64, users: Users) {
        if self.directory.set(directory).is_err() {
            panic!("the user directory is set once");
        }
        self.follow(revision, users);
    }

    /// Cluster mode: the cluster's users at `revision`, taken unless the
    /// store already holds a later revision's.
    pub fn follow(&self, revision: i64, users: Users) {
        let mut at = self.writing.lock().expect("user store writer lock");
        if revision > *at {
            *at = revision;
            *self.users.write().expect("user store lock") = Arc::new(users);
            self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Every user with its credentials (cluster mode hands a node's
    /// catalog users to the cluster at start).
    pub fn all(&self) -> Users {
        (*self.snapshot()).clone()
    }

    /// Changes with every alteration (see the field).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }
}

/// Sets a user's password in a stopped broker's data directory (the
/// `canopy user` subcommand, and how tests give a broker its first users):
/// one credential per mechanism, each with a fresh salt.
pub fn set_password(data_dir: &std::path::Path, user: &str, password: &[u8], mechanisms: &[Mechanism], iterations: u32) -> Result<(), String> {
    let catalog = Catalog::open(&data_dir.join("catalog")).map_err(|e| format!("{e} (is a broker running on {}?)", data_dir.display()))?;
    let store = UserStore::load(&catalog).map_err(|e| e.to_string())?;
    let changes: Vec<Alteration> = mechanisms.iter().map(|&m| Alteration::Upsert { user: user.to_owned(), mechanism: m, credential: Credential::from_password(m, password, iterations) }).collect();
    for r in store.alter(&catalog, &[changes]) {
        r.map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_changes_apply_to_its_current_credentials_all_or_nothing() {
        let c = |pw: &[u8]| Credential::from_password(Mechanism::Sha256, pw, 4096);
        let up = |m, pw: &[u8]| Alteration::Upsert { user: "u".into(), mechanism: m, credential: Credential::from_password(m, pw, 4096) };
        let del = |m| Alteration::Delete { user: "u".into(), mechanism: m };
        let current: Credentials = [(Mechanism::Sha256, c(b"a"))].into();
        let next = altered("u", Some(current.clone()), &[up(Mechanism::Sha512, b"b")]).unwrap().unwrap();
        assert_eq!(next.keys().copied().collect::<Vec<_>>(), vec![Mechanism::Sha256, Mechanism::Sha512]);
        assert_eq!(altered("u", Some(current.clone()), &[del(Mechanism::Sha256)]), Ok(None), "no credential left: no user");
        assert_eq!(altered("u", Some(current), &[up(Mechanism::Sha512, b"b"), del(Mechanism::Sha512), del(Mechanism::Sha512)]), Err(AlterError::NotFound));
        assert_eq!(altered("u", None, &[del(Mechanism::Sha256)]), Err(AlterError::NotFound));
    }

    #[test]
    fn credentials_survive_reopen_and_changes_are_answered_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        set_password(dir.path(), "alice", b"pw1", &Mechanism::ALL, 4096).unwrap();
        let catalog = Catalog::open(&dir.path().join("catalog")).unwrap();
        let store = UserStore::load(&catalog).unwrap();
        assert!(store.verify_password("alice", b"pw1"));
        assert!(!store.verify_password("alice", b"pw2") && !store.verify_password("bob", b"pw1"));
        let cred = Credential::from_password(Mechanism::Sha256, b"pw2", 8192);
        let mut weak = cred.clone();
        weak.iterations = 100;
        let results = store.alter(
            &catalog,
            &[
                vec![Alteration::Upsert { user: "alice".into(), mechanism: Mechanism::Sha256, credential: cred.clone() }, Alteration::Delete { user: "alice".into(), mechanism: Mechanism::Sha512 }],
                vec![Alteration::Upsert { user: "carol".into(), mechanism: Mechanism::Sha256, credential: weak }],
                // All or nothing: dave's good upsert goes with the bad delete.
                vec![Alteration::Upsert { user: "dave".into(), mechanism: Mechanism::Sha256, credential: cred }, Alteration::Delete { user: "dave".into(), mechanism: Mechanism::Sha512 }],
                vec![Alteration::Upsert { user: "".into(), mechanism: Mechanism::Sha256, credential: Credential::from_password(Mechanism::Sha256, b"x", 4096) }],
            ],
        );
        assert!(results[0].is_ok());
        assert!(matches!(&results[1], Err(AlterError::Unacceptable(m)) if m.contains("Iterations 100")));
        assert_eq!(results[2], Err(AlterError::NotFound));
        assert!(matches!(&results[3], Err(AlterError::Unacceptable(_))));
        drop(store);
        drop(catalog);
        let catalog = Catalog::open(&dir.path().join("catalog")).unwrap();
        let store = UserStore::load(&catalog).unwrap();
        assert_eq!(store.describe(None), vec![("alice".to_owned(), Some(vec![(Mechanism::Sha256, 8192)]))]);
        assert!(store.verify_password("alice", b"pw2") && !store.verify_password("alice", b"pw1"), "the rotated password is the one that works");
        assert_eq!(store.describe(Some(&["nobody".into()])), vec![("nobody".to_owned(), None)]);
    }
}
