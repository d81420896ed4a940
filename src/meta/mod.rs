//! The metadata catalog: small, transactional facts kept in sled.
//!
//! Message data never lives here (DESIGN.md: "sled is the catalog, not the
//! log"). Keys are ASCII paths; every value starts with a one-byte encoding
//! version followed by JSON, so a later release can read an older catalog
//! (see the `v1_fixture_loads` test) and change the encoding deliberately.
//!
//! ```text
//! cluster_id                      → v1 JSON string
//! member_of                       → v1 JSON string: the etcd cluster id of the cluster this directory's node belongs to (cluster mode)
//! topic/<name>                    → v1 JSON TopicRecord
//! log_start/<topic id hex>/<p>    → v1 JSON i64 (raised by retention)
//! offset/<len>:<group>/<topic>/<p> → v1 JSON OffsetRecord (a group's committed offset)
//! next_producer_id                → v1 JSON i64 (InitProducerId hands out ids from here)
//! txn/<transactional id>          → v1 JSON TxnRecord (the transaction coordinator's state of it)
//! window/<window, 20 digits>      → v1 JSON WindowRecord (a compaction window: replaced segments, split plan, stores)
//! scram/<user>                    → v1 JSON {mechanism → ScramCredential} (salt, iterations, stored and server keys)
//! acl/<type>\0<pattern>\0<name>\0<principal>\0<host>\0<op>\0<perm> → v1 JSON Acl
//! quota/<user>\0<client-id>       → v1 JSON QuotaRecord (each part empty, \u{1} for the default, or =name)
//! broker_config/<scope>           → v1 JSON {key → value}: dynamic broker configs, scope `default` (BROKER "") or `node` (this broker)
//! ```
//!
//! Group ids are arbitrary strings, so their keys carry the group's byte
//! length first: group `a/b` and topic `t` partition 0 is `offset/3:a/b/t/0`.
//! Topic names cannot contain `/`, so the last two `/` split the rest.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::storage::subtree::WindowRecord;

const V1: u8 = 1;

fn window_key(w: u64) -> String {
    format!("window/{w:020}")
}
const NEXT_PRODUCER_ID: &[u8] = b"next_producer_id";

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("catalog: {0}")]
    Sled(#[from] sled::Error),
    #[error("catalog value under {key} has unknown encoding version {version}")]
    UnknownVersion { key: String, version: u8 },
    #[error("catalog value under {key} does not decode: {why}")]
    Corrupt { key: String, why: String },
}

/// A committed offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRecord {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_ms: i64,
}

/// Where a transaction is (Kafka's states; Dead is the absence of a row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

/// An offset a transaction commits for a group once it commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOffset {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub record: OffsetRecord,
}

/// A transactional id as its coordinator keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRecord {
    pub producer_id: i64,
    pub epoch: i16,
    /// The epoch the producer held before the coordinator bumped it on its
    /// own (aborting a timed-out transaction); -1 if it never did.
    pub last_epoch: i16,
    pub state: TxnState,
    pub timeout_ms: i32,
    /// When the current transaction began (-1: none).
    pub start_ms: i64,
    pub update_ms: i64,
    /// Partitions in the current transaction, by topic name.
    pub partitions: Vec<(String, i32)>,
    /// Groups whose offsets the current transaction commits.
    pub groups: Vec<String>,
    pub offsets: Vec<TxnOffset>,
    /// Set with the decision: each partition's log end then (-1: gone).
    /// The transaction's records all lie below it, so at start-up a
    /// prepared transaction's marker goes only where its records are
    /// still open, never onto a later transaction of the same producer.
    #[serde(default)]
    pub ends: Vec<i64>,
    /// The producer id this one replaced when its epochs ran out at the
    /// end of a transaction (transactions v2); -1 if none. A retry of that
    /// end names it.
    #[serde(default = "no_producer_id")]
    pub previous_producer_id: i64,
    /// Set with the decision of a transaction v2 end whose epochs run out:
    /// the producer id the producer continues with once it completes; -1
    /// if none.
    #[serde(default = "no_producer_id")]
    pub next_producer_id: i64,
}

fn no_producer_id() -> i64 {
    -1
}

fn group_prefix(group: &str) -> String {
    format!("offset/{}:{group}/", group.len())
}

/// Splits `offset/<len>:<group>/<topic>/<p>` back into its parts.
fn parse_offset_key(key: &[u8]) -> Option<(String, String, i32)> {
    let rest = key.strip_prefix(b"offset/")?;
    let colon = rest.iter().position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
    let rest = &rest[colon + 1..];
    let group = std::str::from_utf8(rest.get(..len)?).ok()?.to_owned();
    let rest = std::str::from_utf8(rest.get(len..)?.strip_prefix(b"/")?).ok()?;
    let (topic, p) = rest.rsplit_once('/')?;
    Some((group, topic.to_owned(), p.parse().ok()?))
}

fn one() -> i16 {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub id: [u8; 16],
    pub partitions: i32,
    /// Copies of each partition (cluster mode; 1 in single-node mode, and
    /// in records written before replication).
    #[serde(default = "one")]
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
    pub created_ms: i64,
}

pub struct Catalog {
    db: sled::Db,
    /// The next producer id to hand out, cached so the produce path can
    /// check ids without reading sled.
    next_producer_id: std::sync::atomic::AtomicI64,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![V1];
    serde_json::to_writer(&mut out, v).expect("catalog values serialize");
    out
}

fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], raw: &[u8]) -> Result<T, MetaError> {
    let key_s = || String::from_utf8_lossy(key).into_owned();
    match raw.first() {
        Some(&V1) => serde_json::from_slice(&raw[1..]).map_err(|e| MetaError::Corrupt { key: key_s(), why: e.to_string() }),
        Some(&v) => Err(MetaError::UnknownVersion { key: key_s(), version: v }),
        None => Err(MetaError::Corrupt { key: key_s(), why: "empty value".into() }),
    }
}

pub fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The catalog's page cache (sled's `cache_capacity`).
const CACHE_BYTES: u64 = 64 << 20;

impl Catalog {
    pub fn open(dir: &Path) -> Result<Catalog, MetaError> {
        // sled's I/O threads hold the file lock until they drop their share
        // of the log, after the catalog that used it is dropped (a tool that
        // opened it just before). On a busy disk that outlasts an fsync:
        // wait up to 10 s, then report the lock (another process, such as a
        // running broker).
        Catalog::open_waiting(dir, std::time::Duration::from_secs(10))
    }

    fn open_waiting(dir: &Path, wait: std::time::Duration) -> Result<Catalog, MetaError> {
        // No background flusher: every change is followed by an explicit flush,
        // and a lingering flusher thread would hold the lock after close.
        // sled keeps pages in memory up to its cache capacity (1 GiB by
        // default); the catalog is read at start and rarely after, so a
        // small cache bounds its memory whatever the topic count.
        let config = sled::Config::new().path(dir).mode(sled::Mode::HighThroughput).flush_every_ms(None).cache_capacity(CACHE_BYTES);
        let deadline = std::time::Instant::now() + wait;
        let db = loop {
            match config.open() {
                // sled reports the lock as an `Other` error naming it.
                Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        let next: i64 = match db.get(NEXT_PRODUCER_ID)? {
            Some(raw) => decode(NEXT_PRODUCER_ID, &raw)?,
            None => 1,
        };
        Ok(Catalog { db, next_producer_id: std::sync::atomic::AtomicI64::new(next) })
    }

    /// Makes every earlier write durable.
    pub fn flush(&self) -> Result<(), MetaError> {
        self.db.flush()?;
        Ok(())
    }

    /// The cluster id, created on first start.
    pub fn cluster_id(&self, fresh: impl FnOnce() -> String) -> Result<String, MetaError> {
        if let Some(raw) = self.db.get(b"cluster_id")? {
            return decode(b"cluster_id", &raw);
        }
        let id = fresh();
        self.db.insert(b"cluster_id", encode(&id))?;
        self.flush()?;
        Ok(id)
    }

    /// The cluster (its etcd cluster id) this data directory belongs to,
    /// once a node in cluster mode used it; `None`: single-node mode's.
    pub fn member_of(&self) -> Result<Option<String>, MetaError> {
        self.db.get(b"member_of")?.map(|raw| decode(b"member_of", &raw)).transpose()
    }

    /// Ties the data directory to the cluster `id`, durably.
    pub fn set_member_of(&self, id: &str) -> Result<(), MetaError> {
        self.db.insert(b"member_of", encode(&id))?;
        self.flush()
    }

    pub fn topics(&self) -> Result<Vec<TopicRecord>, MetaError> {
        self.db
            .scan_prefix(b"topic/")
            .map(|kv| {
                let (k, v) = kv?;
                decode(&k, &v)
            })
            .collect()
    }

    /// Inserts or replaces a topic. Not durable until [`Catalog::flush`].
    pub fn put_topic(&self, t: &TopicRecord) -> Result<(), MetaError> {
        self.db.insert(format!("topic/{}", t.name), encode(t))?;
        Ok(())
    }

    /// Removes a topic and its per-partition records.
    pub fn remove_topic(&self, t: &TopicRecord) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        batch.remove(format!("topic/{}", t.name).as_bytes());
        for kv in self.db.scan_prefix(format!("log_start/{}/", hex(&t.id))) {
            batch.remove(kv?.0);
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    pub fn log_starts(&self) -> Result<BTreeMap<([u8; 16], i32), i64>, MetaError> {
        let mut out = BTreeMap::new();
        for kv in self.db.scan_prefix(b"log_start/") {
            let (k, v) = kv?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let mut parts = key.split('/').skip(1);
            let (Some(id), Some(p)) = (parts.next(), parts.next()) else { continue };
            let (Some(id), Ok(p)) = (unhex(id), p.parse::<i32>()) else {
                return Err(MetaError::Corrupt { key, why: "bad log_start key".into() });
            };
            out.insert((id, p), decode(&k, &v)?);
        }
        Ok(out)
    }

    /// Every compaction window, oldest first.
    pub fn windows(&self) -> Result<Vec<WindowRecord>, MetaError> {
        let mut out = Vec::new();
        for kv in self.db.scan_prefix(b"window/") {
            let (k, v) = kv?;
            out.push(decode(&k, &v)?);
        }
        Ok(out)
    }

    /// Records a compaction window, durably: this write is compaction's
    /// switch from segments to stores.
    pub fn put_window(&self, w: &WindowRecord) -> Result<(), MetaError> {
        self.db.insert(window_key(w.window), encode(w))?;
        self.flush()
    }

    /// Marks stores as deleted (retention), durably and all at once.
    pub fn drop_stores(&self, stores: &[(u64, u32)]) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        let mut windows: BTreeMap<u64, WindowRecord> = BTreeMap::new();
        for &(w, s) in stores {
            let key = window_key(w);
            if let std::collections::btree_map::Entry::Vacant(slot) = windows.entry(w) {
                let Some(raw) = self.db.get(&key)? else { continue };
                slot.insert(decode(key.as_bytes(), &raw)?);
            }
            if let Some(rec) = windows.get_mut(&w) {
                for st in rec.stores.iter_mut().filter(|st| st.store == s) {
                    st.live = false;
                }
            }
        }
        for (w, rec) in &windows {
            batch.insert(window_key(*w).as_bytes(), encode(rec));
        }
        self.db.apply_batch(batch)?;
        self.flush()
    }

    /// Records raised log start offsets, durably, in one batch.
    pub fn put_log_starts(&self, starts: &[([u8; 16], i32, i64)]) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        for (id, p, start) in starts {
            batch.insert(format!("log_start/{}/{p}", hex(id)).as_bytes(), encode(start));
        }
        self.db.apply_batch(batch)?;
        self.flush()
    }
}

impl Catalog {
    /// Writes committed offsets (not durable until [`Catalog::flush`]).
    pub fn put_offsets(&self, rows: &[(String, String, i32, OffsetRecord)]) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        for (group, topic, p, rec) in rows {
            batch.insert(format!("{}{topic}/{p}", group_prefix(group)).as_bytes(), encode(rec));
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    /// Every committed offset of a group: (topic, partition, record).
    pub fn group_offsets(&self, group: &str) -> Result<Vec<(String, i32, OffsetRecord)>, MetaError> {
        self.db
            .scan_prefix(group_prefix(group))
            .map(|kv| {
                let (k, v) = kv?;
                let (_, topic, p) = parse_offset_key(&k).ok_or_else(|| MetaError::Corrupt { key: String::from_utf8_lossy(&k).into_owned(), why: "bad offset key".into() })?;
                Ok((topic, p, decode(&k, &v)?))
            })
            .collect()
    }

    /// Groups that have committed offsets.
    pub fn offset_groups(&self) -> Result<Vec<String>, MetaError> {
        let mut out: Vec<String> = Vec::new();
        for kv in self.db.scan_prefix(b"offset/") {
            let (k, _) = kv?;
            if let Some((g, _, _)) = parse_offset_key(&k) {
                if out.last() != Some(&g) {
                    out.push(g);
                }
            }
        }
        out.dedup();
        Ok(out)
    }

    /// Removes the given offsets of a group (all of them when `only` is None).
    /// Removes a group's committed offsets older than `cutoff_ms`, each
    /// only if it is still the row that was judged (compare-and-delete), so
    /// a commit that lands meanwhile is kept. Returns whether any row is
    /// left. Not durable until [`Catalog::flush`].
    pub fn expire_offsets(&self, group: &str, cutoff_ms: i64) -> Result<bool, MetaError> {
        let mut left = false;
        for kv in self.db.scan_prefix(group_prefix(group)) {
            let (k, v) = kv?;
            let r: OffsetRecord = decode(&k, &v)?;
            if r.commit_ms >= cutoff_ms {
                left = true;
                continue;
            }
            if self.db.compare_and_swap(&k, Some(&v), None as Option<&[u8]>)?.is_err() {
                left = true; // changed since it was read: a fresh commit
            }
        }
        Ok(left)
    }

    pub fn remove_offsets(&self, group: &str, only: Option<&[(String, i32)]>) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        match only {
            None => {
                for kv in self.db.scan_prefix(group_prefix(group)) {
                    batch.remove(kv?.0);
                }
            }
            Some(list) => {
                for (topic, p) in list {
                    batch.remove(format!("{}{topic}/{p}", group_prefix(group)).as_bytes());
                }
            }
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    /// Removes every group's offsets for a deleted topic.
    pub fn remove_topic_offsets(&self, topic: &str) -> Result<(), MetaError> {
        let mut batch = sled::Batch::default();
        for kv in self.db.scan_prefix(b"offset/") {
            let (k, _) = kv?;
            if parse_offset_key(&k).is_some_and(|(_, t, _)| t == topic) {
                batch.remove(k);
            }
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }
}

/// The inverse of [`hex`].
pub fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Catalog {
    /// A producer id never handed out before, durably.
    pub fn allocate_producer_id(&self) -> Result<i64, MetaError> {
        const KEY: &[u8] = NEXT_PRODUCER_ID;
        let mut bad = None;
        let prev = self.db.fetch_and_update(KEY, |old| {
            let next = match old.map(|raw| decode::<i64>(KEY, raw)) {
                None => 1,
                Some(Ok(n)) => n,
                Some(Err(e)) => {
                    bad = Some(e);
                    return old.map(<[u8]>::to_vec);
                }
            };
            Some(encode(&(next + 1)))
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        self.flush()?;
        let id = match prev {
            None => 1,
            Some(raw) => decode(KEY, &raw)?,
        };
        self.next_producer_id.fetch_max(id + 1, std::sync::atomic::Ordering::AcqRel);
        Ok(id)
    }

    /// Whether `id` was ever handed out by [`Catalog::allocate_producer_id`]
    /// (no I/O).
    pub fn producer_id_allocated(&self, id: i64) -> bool {
        id >= 1 && id < self.producer_ids_below()
    }

    /// Ids below `below` are this node's to hand out or handed out (a
    /// block of the cluster's): recorded durably, so that no later start,
    /// in either mode, hands them out again.
    pub fn reserve_producer_ids_below(&self, below: i64) -> Result<(), MetaError> {
        const KEY: &[u8] = NEXT_PRODUCER_ID;
        let mut bad = None;
        self.db.fetch_and_update(KEY, |old| match old.map(|raw| decode::<i64>(KEY, raw)) {
            Some(Err(e)) => {
                bad = Some(e);
                old.map(<[u8]>::to_vec)
            }
            Some(Ok(n)) if n >= below => old.map(<[u8]>::to_vec),
            _ => Some(encode(&below)),
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        self.flush()?;
        self.raise_producer_ids_below(below);
        Ok(())
    }

    /// Ids below `below` were handed out elsewhere (by another node of
    /// the cluster): Produce accepts them. Never lowers the bound, and
    /// writes nothing (the local counter is this node's own history).
    pub fn raise_producer_ids_below(&self, below: i64) {
        self.next_producer_id.fetch_max(below, std::sync::atomic::Ordering::AcqRel);
    }

    /// Every id handed out so far is below this.
    pub fn producer_ids_below(&self) -> i64 {
        self.next_producer_id.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Writes a transactional id's state (not durable until
    /// [`Catalog::flush`]).
    pub fn put_txn(&self, id: &str, rec: &TxnRecord) -> Result<(), MetaError> {
        self.db.insert(format!("txn/{id}").as_bytes(), encode(rec))?;
        Ok(())
    }

    pub fn remove_txn(&self, id: &str) -> Result<(), MetaError> {
        self.db.remove(format!("txn/{id}").as_bytes())?;
        Ok(())
    }

    /// Replaces a user's SCRAM credentials (none: removes the user), durably.
    pub fn put_scram_user(&self, user: &str, creds: &crate::auth::users::Credentials) -> Result<(), MetaError> {
        let key = format!("scram/{user}");
        if creds.is_empty() {
            self.db.remove(key.as_bytes())?;
        } else {
            self.db.insert(key.as_bytes(), encode(creds))?;
        }
        self.flush()
    }

    /// Writes (`Some`) or removes (`None`) values under their keys in one
    /// batch, durably.
    fn put_batch<K: AsRef<[u8]>, T: Serialize>(&self, changes: &[(K, Option<&T>)]) -> Result<(), MetaError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (key, value) in changes {
            match value {
                Some(v) => batch.insert(key.as_ref(), encode(v)),
                None => batch.remove(key.as_ref()),
            }
        }
        self.db.apply_batch(batch)?;
        self.flush()
    }

    /// Every value under `prefix`.
    fn scan<T: for<'de> Deserialize<'de>>(&self, prefix: &[u8]) -> Result<Vec<T>, MetaError> {
        self.db
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                decode(&k, &v)
            })
            .collect()
    }

    /// Writes (`Some`) or removes (`None`) ACLs under their keys, durably.
    pub fn put_acls(&self, changes: &[(String, Option<&crate::auth::acl::Acl>)]) -> Result<(), MetaError> {
        self.put_batch(changes)
    }

    /// Writes (`Some`) or removes (`None`) client quota entities under
    /// their keys, durably.
    pub fn put_quotas(&self, changes: &[(&str, Option<&crate::auth::quota::QuotaRecord>)]) -> Result<(), MetaError> {
        self.put_batch(changes)
    }

    /// Replaces the dynamic broker configs of one scope (`default` or
    /// `node`), durably; an empty map removes the scope.
    pub fn put_broker_configs(&self, scope: &str, configs: &BTreeMap<String, String>) -> Result<(), MetaError> {
        self.put_batch(&[(format!("broker_config/{scope}"), (!configs.is_empty()).then_some(configs))])
    }

    /// The dynamic broker configs of one scope (empty when none are set).
    pub fn broker_configs(&self, scope: &str) -> Result<BTreeMap<String, String>, MetaError> {
        let key = format!("broker_config/{scope}");
        match self.db.get(&key)? {
            Some(v) => decode(key.as_bytes(), &v),
            None => Ok(BTreeMap::new()),
        }
    }

    /// Every client quota entity.
    pub fn quotas(&self) -> Result<Vec<crate::auth::quota::QuotaRecord>, MetaError> {
        self.scan(b"quota/")
    }

    /// Every ACL.
    pub fn acls(&self) -> Result<Vec<crate::auth::acl::Acl>, MetaError> {
        self.scan(b"acl/")
    }

    /// Every user's SCRAM credentials.
    pub fn scram_users(&self) -> Result<Vec<(String, crate::auth::users::Credentials)>, MetaError> {
        self.db
            .scan_prefix(b"scram/")
            .map(|kv| {
                let (k, v) = kv?;
                let user = String::from_utf8_lossy(&k[6..]).into_owned();
                Ok((user, decode(&k, &v)?))
            })
            .collect()
    }

    /// Every transactional id's state.
    pub fn txns(&self) -> Result<Vec<(String, TxnRecord)>, MetaError> {
        self.db
            .scan_prefix(b"txn/")
            .map(|kv| {
                let (k, v) = kv?;
                let id = String::from_utf8_lossy(&k[4..]).into_owned();
                Ok((id, decode(&k, &v)?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog still held (sled's threads finishing after a tool's
    /// close) is waited for; one held past the wait is reported.
    #[test]
    fn an_open_waits_for_the_lock_then_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let held = Catalog::open(dir.path()).unwrap();
        let err = Catalog::open_waiting(dir.path(), std::time::Duration::from_millis(100)).err().expect("locked");
        assert!(err.to_string().contains("could not acquire lock"), "{err}");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(held);
        });
        Catalog::open_waiting(dir.path(), std::time::Duration::from_secs(10)).expect("opened once the other let go");
        release.join().unwrap();
    }

    #[test]
    fn expiry_removes_only_old_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        let rec = |commit_ms| OffsetRecord { offset: 1, leader_epoch: -1, metadata: None, commit_ms };
        c.put_offsets(&[("g".into(), "t".into(), 0, rec(10)), ("g".into(), "t".into(), 1, rec(500))]).unwrap();
        assert!(c.expire_offsets("g", 100).unwrap(), "the fresh row stays");
        assert_eq!(c.group_offsets("g").unwrap().iter().map(|(_, p, _)| *p).collect::<Vec<_>>(), vec![1]);
        assert!(!c.expire_offsets("g", 1_000).unwrap());
        assert!(c.group_offsets("g").unwrap().is_empty());
    }

    /// Cluster mode's blocks are recorded before use: a later start (in
    /// either mode) hands out ids above them; a raise from another node's
    /// block is not recorded; nothing lowers the bound.
    #[test]
    fn reserved_producer_id_blocks_survive_reopen_and_raises_do_not() {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = Catalog::open(dir.path()).unwrap();
            c.reserve_producer_ids_below(2001).unwrap();
            c.reserve_producer_ids_below(1001).unwrap();
            assert_eq!(c.producer_ids_below(), 2001);
            c.raise_producer_ids_below(9001);
            assert!(c.producer_id_allocated(9000), "another node's id is taken");
        }
        let c = Catalog::open(dir.path()).unwrap();
        assert_eq!(c.producer_ids_below(), 2001, "the reserve is durable, the raise is not");
        assert_eq!(c.allocate_producer_id().unwrap(), 2001);
    }

    #[test]
    fn producer_ids_are_never_reused_and_transactions_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let rec = TxnRecord {
            producer_id: 0,
            epoch: 3,
            last_epoch: -1,
            state: TxnState::Ongoing,
            timeout_ms: 60_000,
            start_ms: 5,
            update_ms: 6,
            partitions: vec![("a.b".into(), 1)],
            groups: vec!["g/1".into()],
            offsets: vec![TxnOffset { group: "g/1".into(), topic: "a.b".into(), partition: 1, record: OffsetRecord { offset: 9, leader_epoch: -1, metadata: None, commit_ms: 6 } }],
            ends: vec![12],
            previous_producer_id: -1,
            next_producer_id: 4,
        };
        let a = {
            let c = Catalog::open(dir.path()).unwrap();
            let a = c.allocate_producer_id().unwrap();
            assert!(c.producer_id_allocated(a));
            assert!(!c.producer_id_allocated(a + 1));
            c.put_txn("tx/odd id", &TxnRecord { producer_id: a, ..rec.clone() }).unwrap();
            c.put_txn("gone", &rec).unwrap();
            c.remove_txn("gone").unwrap();
            c.flush().unwrap();
            a
        };
        let c = Catalog::open(dir.path()).unwrap();
        assert!(c.producer_id_allocated(a), "known after reopen");
        let b = c.allocate_producer_id().unwrap();
        assert!(b > a, "ids survive reopen and are never handed out twice");
        assert_eq!(c.txns().unwrap(), vec![("tx/odd id".to_string(), TxnRecord { producer_id: a, ..rec.clone() })]);
        // A record written before transactions v2 reads with no previous
        // or next producer id.
        let mut old = serde_json::to_value(&rec).unwrap();
        old.as_object_mut().unwrap().retain(|k, _| k != "previous_producer_id" && k != "next_producer_id");
        let raw = encode(&old);
        let back: TxnRecord = decode(b"txn/old", &raw).unwrap();
        assert_eq!((back.previous_producer_id, back.next_producer_id), (-1, -1));
        assert_eq!(back.ends, rec.ends);
    }

    #[test]
    fn topics_and_log_starts_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t = TopicRecord { name: "a.b".into(), id: [7; 16], partitions: 3, replication_factor: 1, configs: BTreeMap::new(), created_ms: 5 };
        {
            let c = Catalog::open(dir.path()).unwrap();
            assert_eq!(c.cluster_id(|| "abc".into()).unwrap(), "abc");
            c.put_topic(&t).unwrap();
            c.put_log_starts(&[([7; 16], 1, 42)]).unwrap();
        }
        let c = Catalog::open(dir.path()).unwrap();
        assert_eq!(c.cluster_id(|| "other".into()).unwrap(), "abc");
        assert_eq!(c.topics().unwrap(), vec![t.clone()]);
        assert_eq!(c.log_starts().unwrap().get(&([7; 16], 1)), Some(&42));
        c.remove_topic(&t).unwrap();
        assert!(c.topics().unwrap().is_empty());
        assert!(c.log_starts().unwrap().is_empty());
    }

    #[test]
    fn offsets_by_group_with_awkward_group_ids() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(dir.path()).unwrap();
        let rec = |o| OffsetRecord { offset: o, leader_epoch: -1, metadata: Some("m".into()), commit_ms: 1 };
        c.put_offsets(&[
            ("a/b".into(), "t1".into(), 0, rec(5)),
            ("a/b".into(), "t.x".into(), 3, rec(6)),
            ("a".into(), "b/t1".replace('/', "."), 0, rec(7)),
            ("1:".into(), "t1".into(), 1, rec(8)),
        ])
        .unwrap();
        let mut g = c.group_offsets("a/b").unwrap();
        g.sort_by_key(|(t, p, _)| (t.clone(), *p));
        assert_eq!(g.iter().map(|(t, p, r)| (t.as_str(), *p, r.offset)).collect::<Vec<_>>(), vec![("t.x", 3, 6), ("t1", 0, 5)]);
        assert_eq!(c.group_offsets("a").unwrap().len(), 1);
        assert_eq!(c.group_offsets("1:").unwrap()[0].2.offset, 8);
        let mut groups = c.offset_groups().unwrap();
        groups.sort();
        assert_eq!(groups, vec!["1:".to_string(), "a".into(), "a/b".into()]);
        c.remove_topic_offsets("t1").unwrap();
        assert_eq!(c.group_offsets("a/b").unwrap().len(), 1);
        assert!(c.group_offsets("1:").unwrap().is_empty());
        c.remove_offsets("a/b", None).unwrap();
        assert!(c.group_offsets("a/b").unwrap().is_empty());
    }

    #[test]
    fn v1_fixture_loads_and_unknown_versions_are_refused() {
        let raw = br#"{"name":"x","id":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"partitions":2,"configs":{"retention.ms":"5"},"created_ms":1}"#;
        let mut v = vec![1u8];
        v.extend_from_slice(raw);
        let t: TopicRecord = decode(b"topic/x", &v).unwrap();
        assert_eq!(t.partitions, 2);
        assert_eq!(t.configs["retention.ms"], "5");
        v[0] = 9;
        assert!(matches!(decode::<TopicRecord>(b"topic/x", &v), Err(MetaError::UnknownVersion { version: 9, .. })));
        assert!(decode::<TopicRecord>(b"topic/x", &[]).is_err());
    }
}
