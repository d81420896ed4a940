//! The coordinator's journal (cluster mode, docs/cluster.md "Replicated
//! state"): every change to committed offsets is first appended to the
//! group's coordinator shard, partition `shard` of the internal topic
//! `__canopy.coordinators`, and applied to this node's catalog only once
//! the shard's in-sync replicas have it. The shard's next leader rebuilds
//! the committed offsets of its groups from that log before it answers
//! for them, so they survive the death of the node that took them.
//!
//! A classic group's membership goes to the same log, as Kafka's group
//! metadata records do: each completed rebalance (the generation, its
//! protocol, leader, members and their assignments), each time the group
//! becomes Empty, and a tombstone when it is deleted. The shard's next
//! leader restores the group Stable with its members, so they keep their
//! assignments through the move instead of rebalancing.
//!
//! A transactional id's state goes there too (its coordinator is the
//! same shard's leader), as Kafka's `__transaction_state` records: every
//! change of the id's record, and a tombstone when the id expires. The
//! shard's next leader takes the transactions up where they were.
//!
//! A transaction's offsets wait in the group's shard until its end
//! (Kafka's pending transactional offsets): one record per (group, topic,
//! partition, producer id), replaced at the end by the committed offset
//! (a commit) and a tombstone of the pending one, in one batch, so that
//! compaction never keeps a pending offset without what ended it.
//!
//! Records are keyed so that the topic's compaction
//! (`cleanup.policy=compact`) keeps the last one per key: one per
//! (group, topic, partition) for offsets, one per group for membership,
//! one per transactional id; a removal is a tombstone. All are our own small, versioned encodings:
//!
//! ```text
//! offset key:   kind u8 (0) | group: u16 len, bytes | topic: u16 len, bytes | partition i32
//! offset value: version u8 (0) | offset i64 | leader_epoch i32 | commit_ms i64 | metadata: i32 len (-1: null), bytes
//! group key:    kind u8 (1) | group: u16 len, bytes
//! group value:  version u8 (0) | generation i32 | protocol_type, protocol, leader: string
//!               | stored_ms i64 | members: i32 count, each:
//!                 id, instance_id, client_id, client_host: string
//!                 | session_timeout_ms i32 | rebalance_timeout_ms i32
//!                 | metadata, assignment: i32 len, bytes
//!               string: i32 len (-1: null), UTF-8 bytes
//! ```
//!
//! ```text
//! txn key:      kind u8 (2) | transactional id: string
//! txn value:    version u8 (0) | producer_id i64 | epoch i16 | last_epoch i16
//!               | state u8 (Empty 0, Ongoing 1, PrepareCommit 2, PrepareAbort 3,
//!                 CompleteCommit 4, CompleteAbort 5)
//!               | timeout_ms i32 | start_ms i64 | update_ms i64
//!               | previous_producer_id i64 | next_producer_id i64
//!               | partitions: i32 count, each: topic string, partition i32
//!               | ends: i32 count, each i64
//!               | groups: i32 count, each string
//!               | offsets: i32 count, each: group, topic: string | partition i32
//!                 | offset i64 | leader_epoch i32 | commit_ms i64 | metadata: string
//! pending key:  kind u8 (3) | group, topic: u16 len, bytes | partition i32 | producer_id i64
//! pending value: version u8 (0) | producer_epoch i16 | then an offset value's fields
//! fence key:    kind u8 (4) | producer_id i64
//! fence value:  version u8 (0) | coordinator_epoch i32
//! ```
//!
//! A group value's strings come from clients (instance ids, protocol
//! names, client ids), whose lengths only the request size bounds: hence
//! i32 lengths there, where keys' names are ours to bound. Transactional
//! ids are bounded by nothing else either, so their key and value use
//! i32 lengths throughout.
//!
//! Decoding checks every length and count against what is there: a
//! record that does not decode fails the shard's load (the log is
//! checksummed, so that is a bug, not a torn write), while a record of a
//! kind this version does not know is passed by (a newer node's).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::meta::{OffsetRecord, TxnOffset, TxnRecord, TxnState};
use crate::protocol::batch::{self, NewRecord};

/// The record kind of a committed offset.
const KIND_OFFSET: u8 = 0;
/// The record kind of a classic group's membership.
const KIND_GROUP: u8 = 1;
/// The record kind of a transactional id's state.
const KIND_TXN: u8 = 2;
/// The record kind of an offset a transaction commits when it commits.
const KIND_PENDING: u8 = 3;
/// The record kind of the newest coordinator epoch of a producer's
/// markers on this shard.
const KIND_FENCE: u8 = 4;
const VALUE_VERSION: u8 = 0;

/// One change: `Some` puts the committed offset, `None` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub record: Option<OffsetRecord>,
}

/// A classic group as its coordinator last stored it: after a completed
/// rebalance (Stable, with members), or Empty (no members).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// When it was stored (an Empty group's offsets expire from then).
    pub stored_ms: i64,
    pub members: Vec<StoredMember>,
}

/// A member of a stored group: its metadata is the chosen protocol's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// One record of a shard's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Offset(Entry),
    /// `None` removes the group (DeleteGroups, expiry).
    Group { group: String, state: Option<StoredGroup> },
    /// `None` removes the transactional id (it expired).
    Txn { id: String, state: Option<TxnRecord> },
    /// An offset (`producer_id`, epoch)'s transaction commits for the
    /// group if it commits; `None` removes it (its transaction ended).
    Pending { group: String, topic: String, partition: i32, producer_id: i64, state: Option<(i16, OffsetRecord)> },
    /// The newest coordinator epoch of `producer_id`'s markers here: an
    /// older coordinator's marker is refused (a deposed one's, late).
    Fence { producer_id: i64, coordinator_epoch: i32 },
}

/// What a shard's log says: every committed offset it holds now.
pub type Rows = BTreeMap<(String, String, i32), OffsetRecord>;

/// Transactional ids and their records.
pub type Txns = BTreeMap<String, TxnRecord>;

/// Offsets open transactions commit if they commit: (group, topic,
/// partition, producer id) -> (producer epoch, offset).
pub type Pending = BTreeMap<PendingKey, (i16, OffsetRecord)>;

/// (group, topic, partition, producer id) of a pending offset.
pub type PendingKey = (String, String, i32, i64);

/// Producer id -> the newest coordinator epoch of its markers.
pub type Fences = BTreeMap<i64, i32>;

/// What a shard's log says: committed offsets, the last stored state
/// of each classic group that has one, and its transactional ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shard {
    pub offsets: Rows,
    pub groups: BTreeMap<String, StoredGroup>,
    pub txns: Txns,
    pub pending: Pending,
    pub fences: Fences,
}

/// Where a cluster's coordinator writes its changes before it applies
/// them, and whether it may answer for a shard.
pub trait Journal: Send + Sync + 'static {
    /// Appends `records` (all of groups in `shard`) to the shard's log and
    /// returns once its in-sync replicas have them; `Err` is the error
    /// code a client gets (Kafka's mapping for offset commits).
    fn append(&self, shard: u32, records: Vec<Record>) -> Pin<Box<dyn Future<Output = Result<(), i16>> + Send + '_>>;

    /// Whether this node leads `shard` and has loaded it in its current
    /// leader epoch: its groups may be answered for.
    fn ready(&self, shard: u32) -> bool;

    /// The catalog may not hold what `shard`'s log does (a change appended
    /// but not applied): load the shard again before answering for it.
    fn reload(&self, shard: u32);

    /// The leader epoch this node loaded `shard` in, while it may answer
    /// for it: its transaction coordinator's epoch (None: not loaded here).
    fn epoch(&self, shard: u32) -> Option<i32>;
}

/// The coordinator shard of a group or transactional id.
pub use crate::cluster::topics::coordinator_shard as shard_of;

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Group ids are at most MAX_GROUP_ID_LEN and topic names 249 bytes:
    // both fit a u16.
    let len = u16::try_from(s.len()).expect("group ids and topic names are short");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The record key of (group, topic, partition).
pub fn encode_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    partition_key(KIND_OFFSET, group, topic, partition, 0)
}

/// A key of `kind` naming (group, topic, partition), with room for
/// `more` bytes after.
fn partition_key(kind: u8, group: &str, topic: &str, partition: i32, more: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 2 + group.len() + 2 + topic.len() + 4 + more);
    out.push(kind);
    put_str(&mut out, group);
    put_str(&mut out, topic);
    out.extend_from_slice(&partition.to_be_bytes());
    out
}

pub fn encode_value(r: &OffsetRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + 4 + 8 + 4 + r.metadata.as_ref().map_or(0, String::len));
    out.push(VALUE_VERSION);
    put_offset(&mut out, r);
    out
}

/// An offset's fields, after the value's version.
fn put_offset(out: &mut Vec<u8>, r: &OffsetRecord) {
    let meta = r.metadata.as_deref().map(str::as_bytes);
    out.extend_from_slice(&r.offset.to_be_bytes());
    out.extend_from_slice(&r.leader_epoch.to_be_bytes());
    out.extend_from_slice(&r.commit_ms.to_be_bytes());
    match meta {
        Some(m) => {
            out.extend_from_slice(&(m.len() as i32).to_be_bytes());
            out.extend_from_slice(m);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
}

/// The record key of a pending offset of `producer_id`'s transaction.
pub fn encode_pending_key(group: &str, topic: &str, partition: i32, producer_id: i64) -> Vec<u8> {
    let mut out = partition_key(KIND_PENDING, group, topic, partition, 8);
    out.extend_from_slice(&producer_id.to_be_bytes());
    out
}

pub fn encode_pending_value(epoch: i16, r: &OffsetRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 2 + 8 + 4 + 8 + 4 + r.metadata.as_ref().map_or(0, String::len));
    out.push(VALUE_VERSION);
    out.extend_from_slice(&epoch.to_be_bytes());
    put_offset(&mut out, r);
    out
}

/// The record key of a group's membership.
pub fn encode_group_key(group: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 2 + group.len());
    out.push(KIND_GROUP);
    put_str(&mut out, group);
    out
}

/// Bytes (or a string) from a client, with an i32 length: a request is
/// far smaller than 2 GiB, so every such length fits.
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let len = i32::try_from(b.len()).expect("what a request carries is bounded by the request size");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(b);
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_bytes(out, s.as_bytes()),
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
}

pub fn encode_group_value(g: &StoredGroup) -> Vec<u8> {
    let members: usize = g.members.iter().map(|m| 4 * 4 + m.id.len() + m.instance_id.as_ref().map_or(0, String::len) + m.client_id.len() + m.client_host.len() + 2 * 4 + 2 * 4 + m.metadata.len() + m.assignment.len()).sum();
    let mut out = Vec::with_capacity(1 + 4 + 3 * 4 + 8 + 4 + members + 64);
    out.push(VALUE_VERSION);
    out.extend_from_slice(&g.generation.to_be_bytes());
    put_opt_str(&mut out, g.protocol_type.as_deref());
    put_opt_str(&mut out, g.protocol.as_deref());
    put_opt_str(&mut out, g.leader.as_deref());
    out.extend_from_slice(&g.stored_ms.to_be_bytes());
    let count = i32::try_from(g.members.len()).expect("groups are bounded by group.max.size");
    out.extend_from_slice(&count.to_be_bytes());
    for m in &g.members {
        put_bytes(&mut out, m.id.as_bytes());
        put_opt_str(&mut out, m.instance_id.as_deref());
        put_bytes(&mut out, m.client_id.as_bytes());
        put_bytes(&mut out, m.client_host.as_bytes());
        out.extend_from_slice(&m.session_timeout_ms.to_be_bytes());
        out.extend_from_slice(&m.rebalance_timeout_ms.to_be_bytes());
        put_bytes(&mut out, &m.metadata);
        put_bytes(&mut out, &m.assignment);
    }
    out
}

/// The record key of a transactional id.
pub fn encode_txn_key(id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 4 + id.len());
    out.push(KIND_TXN);
    put_bytes(&mut out, id.as_bytes());
    out
}

/// A transaction state's code is its place here.
const TXN_STATES: [TxnState; 6] = [TxnState::Empty, TxnState::Ongoing, TxnState::PrepareCommit, TxnState::PrepareAbort, TxnState::CompleteCommit, TxnState::CompleteAbort];

fn txn_state_code(s: TxnState) -> u8 {
    TXN_STATES.iter().position(|t| *t == s).expect("every state is listed") as u8
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    let n = i32::try_from(n).expect("a transaction's lists are bounded by the requests that built them");
    out.extend_from_slice(&n.to_be_bytes());
}

pub fn encode_txn_value(r: &TxnRecord) -> Vec<u8> {
    let names: usize = r.partitions.iter().map(|(t, _)| 8 + t.len()).sum::<usize>()
        + r.groups.iter().map(|g| 4 + g.len()).sum::<usize>()
        + r.offsets.iter().map(|o| 4 * 3 + o.group.len() + o.topic.len() + 4 + 8 + 4 + 8 + o.record.metadata.as_ref().map_or(0, String::len)).sum::<usize>();
    let mut out = Vec::with_capacity(1 + 8 + 2 + 2 + 1 + 4 + 8 * 5 + 4 * 4 + 8 * r.ends.len() + names);
    out.push(VALUE_VERSION);
    out.extend_from_slice(&r.producer_id.to_be_bytes());
    out.extend_from_slice(&r.epoch.to_be_bytes());
    out.extend_from_slice(&r.last_epoch.to_be_bytes());
    out.push(txn_state_code(r.state));
    out.extend_from_slice(&r.timeout_ms.to_be_bytes());
    out.extend_from_slice(&r.start_ms.to_be_bytes());
    out.extend_from_slice(&r.update_ms.to_be_bytes());
    out.extend_from_slice(&r.previous_producer_id.to_be_bytes());
    out.extend_from_slice(&r.next_producer_id.to_be_bytes());
    put_count(&mut out, r.partitions.len());
    for (topic, p) in &r.partitions {
        put_bytes(&mut out, topic.as_bytes());
        out.extend_from_slice(&p.to_be_bytes());
    }
    put_count(&mut out, r.ends.len());
    for end in &r.ends {
        out.extend_from_slice(&end.to_be_bytes());
    }
    put_count(&mut out, r.groups.len());
    for g in &r.groups {
        put_bytes(&mut out, g.as_bytes());
    }
    put_count(&mut out, r.offsets.len());
    for o in &r.offsets {
        put_bytes(&mut out, o.group.as_bytes());
        put_bytes(&mut out, o.topic.as_bytes());
        out.extend_from_slice(&o.partition.to_be_bytes());
        put_offset(&mut out, &o.record);
    }
    out
}

/// A record's key and value (`None`: a tombstone).
pub fn encode_record(r: &Record) -> (Vec<u8>, Option<Vec<u8>>) {
    match r {
        Record::Offset(e) => (encode_key(&e.group, &e.topic, e.partition), e.record.as_ref().map(encode_value)),
        Record::Group { group, state } => (encode_group_key(group), state.as_ref().map(encode_group_value)),
        Record::Txn { id, state } => (encode_txn_key(id), state.as_ref().map(encode_txn_value)),
        Record::Pending { group, topic, partition, producer_id, state } => (encode_pending_key(group, topic, *partition, *producer_id), state.as_ref().map(|(epoch, r)| encode_pending_value(*epoch, r))),
        Record::Fence { producer_id, coordinator_epoch } => {
            let mut key = vec![KIND_FENCE];
            key.extend_from_slice(&producer_id.to_be_bytes());
            let mut value = vec![VALUE_VERSION];
            value.extend_from_slice(&coordinator_epoch.to_be_bytes());
            (key, Some(value))
        }
    }
}

/// `records` as one uncompressed batch (the log assigns its offsets).
pub fn encode_batch(records: &[Record], now_ms: i64) -> Vec<u8> {
    let (keys, values): (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) = records.iter().map(encode_record).unzip();
    let records: Vec<NewRecord<'_>> = keys.iter().zip(&values).map(|(k, v)| NewRecord { key: Some(k), value: v.as_deref(), headers: Vec::new() }).collect();
    batch::build(&records, now_ms)
}

/// A reader over a key or value that refuses to read past its end.
struct Take<'a>(&'a [u8]);

impl<'a> Take<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{} bytes needed, {} left", n, self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_be_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self, len: usize) -> Result<String, String> {
        String::from_utf8(self.bytes(len)?.to_vec()).map_err(|_| "a string is not UTF-8".to_string())
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.bytes(2)?.try_into().expect("2 bytes")))
    }
    /// A count of items that each take at least one byte: never trusted
    /// for allocation, and refused once it is past what is left.
    fn count(&mut self) -> Result<usize, String> {
        let n = self.i32()?;
        let n = usize::try_from(n).map_err(|_| format!("a count of {n}"))?;
        if n > self.0.len() {
            return Err(format!("a count of {n} with {} bytes left", self.0.len()));
        }
        Ok(n)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.bytes(2)?.try_into().expect("2 bytes")))
    }
    fn short_string(&mut self) -> Result<String, String> {
        let len = self.u16()?;
        self.string(len as usize)
    }
    fn opt_string(&mut self) -> Result<Option<String>, String> {
        match self.i32()? {
            -1 => Ok(None),
            len => {
                let len = usize::try_from(len).map_err(|_| format!("a string length of {len}"))?;
                self.string(len).map(Some)
            }
        }
    }
    fn long_string(&mut self) -> Result<String, String> {
        self.opt_string()?.ok_or_else(|| "a null string where one is needed".to_string())
    }
    fn sized_bytes(&mut self) -> Result<Bytes, String> {
        let len = self.i32()?;
        let len = usize::try_from(len).map_err(|_| format!("a length of {len}"))?;
        Ok(Bytes::copy_from_slice(self.bytes(len)?))
    }
    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes past the end", self.0.len()))
        }
    }
}

/// One record's (key, value); `Ok(None)` for a record of a kind this
/// version does not know.
pub fn decode_record(key: &[u8], value: Option<&[u8]>) -> Result<Option<Record>, String> {
    let mut k = Take(key);
    match k.u8()? {
        KIND_OFFSET => decode_offset(k, value).map(|e| Some(Record::Offset(e))),
        KIND_GROUP => {
            let group = k.short_string()?;
            k.end()?;
            let state = value.map(decode_group_value).transpose()?;
            Ok(Some(Record::Group { group, state }))
        }
        KIND_TXN => {
            let id = k.long_string()?;
            k.end()?;
            let state = value.map(decode_txn_value).transpose()?;
            Ok(Some(Record::Txn { id, state }))
        }
        KIND_PENDING => {
            let (group, topic, partition) = take_partition(&mut k)?;
            let producer_id = k.i64()?;
            k.end()?;
            let state = value.map(|v| value_of(v, "pending offset", |v| Ok((v.i16()?, take_offset(v)?)))).transpose()?;
            Ok(Some(Record::Pending { group, topic, partition, producer_id, state }))
        }
        KIND_FENCE => {
            let producer_id = k.i64()?;
            k.end()?;
            let coordinator_epoch = value_of(value.ok_or("a fence without a value")?, "fence", |v| v.i32())?;
            Ok(Some(Record::Fence { producer_id, coordinator_epoch }))
        }
        _ => Ok(None),
    }
}

/// The (group, topic, partition) an offset's or a pending offset's key
/// names.
fn take_partition(k: &mut Take<'_>) -> Result<(String, String, i32), String> {
    Ok((k.short_string()?, k.short_string()?, k.i32()?))
}

fn decode_offset(mut k: Take<'_>, value: Option<&[u8]>) -> Result<Entry, String> {
    let (group, topic, partition) = take_partition(&mut k)?;
    k.end()?;
    let record = value.map(|v| value_of(v, "offset", take_offset)).transpose()?;
    Ok(Entry { group, topic, partition, record })
}

/// A value of this version, all of it taken by `read`.
fn value_of<T>(v: &[u8], what: &str, read: impl FnOnce(&mut Take<'_>) -> Result<T, String>) -> Result<T, String> {
    let mut v = Take(v);
    let version = v.u8()?;
    if version != VALUE_VERSION {
        return Err(format!("{what} value version {version}"));
    }
    let out = read(&mut v)?;
    v.end()?;
    Ok(out)
}

/// An offset's fields, after the value's version.
fn take_offset(v: &mut Take<'_>) -> Result<OffsetRecord, String> {
    let offset = v.i64()?;
    let leader_epoch = v.i32()?;
    let commit_ms = v.i64()?;
    let metadata = match v.i32()? {
        -1 => None,
        n if n >= 0 => Some(v.string(n as usize)?),
        n => return Err(format!("metadata length {n}")),
    };
    Ok(OffsetRecord { offset, leader_epoch, metadata, commit_ms })
}

fn decode_group_value(v: &[u8]) -> Result<StoredGroup, String> {
    value_of(v, "group", take_group)
}

fn take_group(v: &mut Take<'_>) -> Result<StoredGroup, String> {
    let generation = v.i32()?;
    let protocol_type = v.opt_string()?;
    let protocol = v.opt_string()?;
    let leader = v.opt_string()?;
    let stored_ms = v.i64()?;
    let count = v.i32()?;
    let count = usize::try_from(count).map_err(|_| format!("a member count of {count}"))?;
    // The count is not trusted for allocation: each member is read from
    // what is there, and a count past it fails at the first missing byte.
    let mut members = Vec::new();
    for _ in 0..count {
        members.push(StoredMember {
            id: v.long_string()?,
            instance_id: v.opt_string()?,
            client_id: v.long_string()?,
            client_host: v.long_string()?,
            session_timeout_ms: v.i32()?,
            rebalance_timeout_ms: v.i32()?,
            metadata: v.sized_bytes()?,
            assignment: v.sized_bytes()?,
        });
    }
    Ok(StoredGroup { generation, protocol_type, protocol, leader, stored_ms, members })
}

fn decode_txn_value(v: &[u8]) -> Result<TxnRecord, String> {
    value_of(v, "transaction", take_txn)
}

fn take_txn(v: &mut Take<'_>) -> Result<TxnRecord, String> {
    let producer_id = v.i64()?;
    let epoch = v.i16()?;
    let last_epoch = v.i16()?;
    let code = v.u8()?;
    let state = *TXN_STATES.get(code as usize).ok_or_else(|| format!("transaction state {code}"))?;
    let timeout_ms = v.i32()?;
    let start_ms = v.i64()?;
    let update_ms = v.i64()?;
    let previous_producer_id = v.i64()?;
    let next_producer_id = v.i64()?;
    let mut partitions = Vec::new();
    for _ in 0..v.count()? {
        partitions.push((v.long_string()?, v.i32()?));
    }
    let mut ends = Vec::new();
    for _ in 0..v.count()? {
        ends.push(v.i64()?);
    }
    let mut groups = Vec::new();
    for _ in 0..v.count()? {
        groups.push(v.long_string()?);
    }
    let mut offsets = Vec::new();
    for _ in 0..v.count()? {
        let group = v.long_string()?;
        let topic = v.long_string()?;
        let partition = v.i32()?;
        offsets.push(TxnOffset { group, topic, partition, record: take_offset(v)? });
    }
    Ok(TxnRecord { producer_id, epoch, last_epoch, state, timeout_ms, start_ms, update_ms, partitions, groups, offsets, ends, previous_producer_id, next_producer_id })
}

/// Applies every record of `batches` (whole batches as the log holds
/// them, in offset order) to `shard`. Control batches are passed by.
/// `max_bytes` bounds what one batch may inflate to.
pub fn replay(shard: &mut Shard, batches: &[u8], max_bytes: usize) -> Result<(), String> {
    for b in batch::split(batches) {
        let b = b.map_err(|e| e.to_string())?;
        let h = batch::validate(b, max_bytes).map_err(|e| e.to_string())?;
        if h.is_control() {
            continue;
        }
        let records = batch::records_of(b, &h, max_bytes).map_err(|e| e.to_string())?;
        for r in batch::records_view(&records, h.records_count) {
            let r = r.map_err(|e| e.to_string())?;
            let key = r.key.ok_or("a record without a key")?;
            match decode_record(key, r.value)? {
                None => {}
                Some(Record::Offset(e)) => {
                    let at = (e.group, e.topic, e.partition);
                    match e.record {
                        Some(rec) => shard.offsets.insert(at, rec),
                        None => shard.offsets.remove(&at),
                    };
                }
                Some(Record::Group { group, state: Some(g) }) => {
                    shard.groups.insert(group, g);
                }
                Some(Record::Group { group, state: None }) => {
                    shard.groups.remove(&group);
                }
                Some(Record::Txn { id, state: Some(t) }) => {
                    shard.txns.insert(id, t);
                }
                Some(Record::Txn { id, state: None }) => {
                    shard.txns.remove(&id);
                }
                Some(Record::Fence { producer_id, coordinator_epoch }) => {
                    let e = shard.fences.entry(producer_id).or_insert(coordinator_epoch);
                    *e = (*e).max(coordinator_epoch);
                }
                Some(Record::Pending { group, topic, partition, producer_id, state }) => {
                    let at = (group, topic, partition, producer_id);
                    match state {
                        Some(p) => shard.pending.insert(at, p),
                        None => shard.pending.remove(&at),
                    };
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: i64, metadata: Option<&str>) -> OffsetRecord {
        OffsetRecord { offset, leader_epoch: 3, metadata: metadata.map(str::to_owned), commit_ms: 1_700_000_000_000 }
    }

    fn put(group: &str, topic: &str, p: i32, r: OffsetRecord) -> Record {
        Record::Offset(Entry { group: group.into(), topic: topic.into(), partition: p, record: Some(r) })
    }

    fn stored(generation: i32, members: &[(&str, Option<&str>)]) -> StoredGroup {
        StoredGroup {
            generation,
            protocol_type: Some("consumer".into()),
            protocol: (!members.is_empty()).then(|| "range".into()),
            leader: members.first().map(|(id, _)| id.to_string()),
            stored_ms: 1_700_000_000_123,
            members: members
                .iter()
                .map(|(id, instance)| StoredMember {
                    id: id.to_string(),
                    instance_id: instance.map(str::to_owned),
                    client_id: "rdkafka".into(),
                    client_host: "/127.0.0.1".into(),
                    session_timeout_ms: 6000,
                    rebalance_timeout_ms: 300_000,
                    metadata: Bytes::from(format!("subscription of {id}")),
                    assignment: Bytes::from(format!("assignment of {id}")),
                })
                .collect(),
        }
    }

    #[test]
    fn the_last_change_per_key_wins_and_tombstones_remove() {
        let first = encode_batch(&[put("g", "t", 0, rec(5, None)), put("g", "t", 1, rec(7, Some("m"))), put("h", "t", 0, rec(1, Some("")))], 1);
        let second = encode_batch(&[put("g", "t", 0, rec(9, None)), Record::Offset(Entry { group: "h".into(), topic: "t".into(), partition: 0, record: None })], 2);
        let mut log = first.clone();
        log.extend_from_slice(&second);
        let mut shard = Shard::default();
        replay(&mut shard, &log, 1 << 20).unwrap();
        let rows = &shard.offsets;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[&("g".into(), "t".into(), 0)], rec(9, None));
        assert_eq!(rows[&("g".into(), "t".into(), 1)], rec(7, Some("m")));
        assert!(shard.groups.is_empty());
    }

    #[test]
    fn records_round_trip_and_unknown_kinds_are_passed_by() {
        let Record::Offset(e) = put("group-é", "app.events", 11, rec(-1, Some("meta"))) else { unreachable!() };
        let key = encode_key(&e.group, &e.topic, e.partition);
        let value = encode_value(e.record.as_ref().unwrap());
        assert_eq!(decode_record(&key, Some(&value)).unwrap(), Some(Record::Offset(e.clone())));
        assert_eq!(decode_record(&key, None).unwrap(), Some(Record::Offset(Entry { record: None, ..e })));
        let mut other = key.clone();
        other[0] = 7;
        assert_eq!(decode_record(&other, Some(b"whatever")).unwrap(), None);
    }

    /// `r` encodes and decodes back to itself.
    fn round_trips(r: Record) {
        let (key, value) = encode_record(&r);
        assert_eq!(decode_record(&key, value.as_deref()).unwrap(), Some(r));
    }

    /// Every cut of a key or value, and a byte past either's end, fails.
    fn cut_and_extended_fail(key: &[u8], value: &[u8]) {
        for n in 0..key.len() {
            assert!(decode_record(&key[..n], Some(value)).is_err(), "key cut at {n}");
        }
        for n in 0..value.len() {
            assert!(decode_record(key, Some(&value[..n])).is_err(), "value cut at {n}");
        }
        let mut long = key.to_vec();
        long.push(0);
        assert!(decode_record(&long, Some(value)).is_err(), "a byte past the key's end");
        let mut long = value.to_vec();
        long.push(0);
        assert!(decode_record(key, Some(&long)).is_err(), "a byte past the value's end");
    }

    #[test]
    fn truncated_oversized_and_malformed_records_are_errors() {
        let key = encode_key("g", "t", 0);
        let value = encode_value(&rec(4, Some("abc")));
        cut_and_extended_fail(&key, &value);
        // A metadata length far past the value, and a negative one.
        let mut huge = value[..21].to_vec();
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(decode_record(&key, Some(&huge)).is_err());
        let mut negative = value[..21].to_vec();
        negative.extend_from_slice(&(-2i32).to_be_bytes());
        assert!(decode_record(&key, Some(&negative)).is_err());
        // A group length past the key.
        let mut k = vec![KIND_OFFSET];
        k.extend_from_slice(&u16::MAX.to_be_bytes());
        k.extend_from_slice(b"g");
        assert!(decode_record(&k, None).is_err());
        // Not UTF-8, and an unknown value version.
        let mut bad = vec![KIND_OFFSET, 0, 1, 0xff, 0, 1, b't'];
        bad.extend_from_slice(&0i32.to_be_bytes());
        assert!(decode_record(&bad, None).is_err());
        let mut v = value.clone();
        v[0] = 1;
        assert!(decode_record(&key, Some(&v)).is_err());
    }

    #[test]
    fn a_torn_or_keyless_log_fails_the_replay() {
        let log = encode_batch(&[put("g", "t", 0, rec(5, None))], 1);
        let mut rows = Shard::default();
        assert!(replay(&mut rows, &log[..log.len() - 1], 1 << 20).is_err(), "a torn batch");
        let keyless = batch::build(&[NewRecord { key: None, value: Some(b"x"), headers: Vec::new() }], 1);
        assert!(replay(&mut rows, &keyless, 1 << 20).is_err(), "a record without a key");
        let mut flipped = log.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(replay(&mut rows, &flipped, 1 << 20).is_err(), "a CRC that does not match");
        assert_eq!(rows, Shard::default(), "nothing applied from a bad log");
    }

    #[test]
    fn a_groups_last_state_wins_beside_its_offsets_and_a_tombstone_removes_it() {
        let one = Record::Group { group: "g".into(), state: Some(stored(1, &[("m1", None), ("m2", Some("i2"))])) };
        let two = Record::Group { group: "g".into(), state: Some(stored(2, &[("m2", Some("i2"))])) };
        let other = Record::Group { group: "h".into(), state: Some(stored(4, &[])) };
        let gone = Record::Group { group: "h".into(), state: None };
        let mut log = encode_batch(&[one, put("g", "t", 0, rec(5, None)), other], 1);
        log.extend_from_slice(&encode_batch(&[two.clone(), gone], 2));
        let mut shard = Shard::default();
        replay(&mut shard, &log, 1 << 20).unwrap();
        assert_eq!(shard.offsets.len(), 1);
        assert_eq!(shard.groups.len(), 1, "h's tombstone removed it");
        let Record::Group { state: Some(expected), .. } = two else { unreachable!() };
        assert_eq!(shard.groups["g"], expected);
    }

    #[test]
    fn group_records_round_trip() {
        for g in [stored(7, &[("m1", None), ("m2", Some("static-é"))]), stored(3, &[]), StoredGroup { protocol_type: None, ..stored(0, &[]) }] {
            round_trips(Record::Group { group: "gé".into(), state: Some(g) });
        }
        round_trips(Record::Group { group: "g".into(), state: None });
    }

    #[test]
    fn truncated_oversized_and_malformed_group_records_are_errors() {
        let (key, value) = encode_record(&Record::Group { group: "g".into(), state: Some(stored(2, &[("m1", Some("i")), ("m2", None)])) });
        let value = value.unwrap();
        cut_and_extended_fail(&key, &value);
        // The member count sits after version, generation, three strings
        // and stored_ms.
        let at = 1 + 4 + (4 + "consumer".len()) + (4 + "range".len()) + (4 + "m1".len()) + 8;
        assert_eq!(&value[at..at + 4], &2i32.to_be_bytes());
        for count in [i32::MAX, 3, -1] {
            let mut v = value.clone();
            v[at..at + 4].copy_from_slice(&count.to_be_bytes());
            assert!(decode_record(&key, Some(&v)).is_err(), "a member count of {count}");
        }
        // A member's metadata length far past the value, and a negative one.
        let meta_at = at + 4 + (4 + 2) + (4 + 1) + (4 + "rdkafka".len()) + (4 + "/127.0.0.1".len()) + 8;
        assert_eq!(&value[meta_at..meta_at + 4], &("subscription of m1".len() as i32).to_be_bytes());
        for len in [i32::MAX, -2] {
            let mut v = value.clone();
            v[meta_at..meta_at + 4].copy_from_slice(&len.to_be_bytes());
            assert!(decode_record(&key, Some(&v)).is_err(), "a metadata length of {len}");
        }
        let mut v = value.clone();
        v[0] = 1;
        assert!(decode_record(&key, Some(&v)).is_err(), "an unknown value version");
        // A leader that is not UTF-8; a member id that is null, or whose
        // length is negative or far past the value.
        let mut v = value.clone();
        let leader_at = 1 + 4 + (4 + "consumer".len()) + (4 + "range".len()) + 4;
        v[leader_at] = 0xff;
        assert!(decode_record(&key, Some(&v)).is_err(), "a leader that is not UTF-8");
        let id_at = at + 4;
        assert_eq!(&value[id_at..id_at + 4], &2i32.to_be_bytes());
        for len in [-1, -2, i32::MAX] {
            let mut v = value.clone();
            v[id_at..id_at + 4].copy_from_slice(&len.to_be_bytes());
            assert!(decode_record(&key, Some(&v)).is_err(), "a member id length of {len}");
        }
        // Strings longer than a u16 (client-given ones may be) round-trip.
        let mut long = stored(1, &[("m1", None)]);
        long.members[0].instance_id = Some("i".repeat(70_000));
        long.protocol = Some("p".repeat(65_535));
        let r = Record::Group { group: "g".into(), state: Some(long) };
        let (k, v) = encode_record(&r);
        assert_eq!(decode_record(&k, v.as_deref()).unwrap(), Some(r));
    }

    fn txn(state: TxnState) -> TxnRecord {
        TxnRecord {
            producer_id: 4000,
            epoch: 7,
            last_epoch: 6,
            state,
            timeout_ms: 60_000,
            start_ms: 1_700_000_000_000,
            update_ms: 1_700_000_000_500,
            partitions: vec![("app.events".into(), 3), ("app.é".into(), 0)],
            groups: vec!["g".into()],
            offsets: vec![TxnOffset { group: "g".into(), topic: "app.events".into(), partition: 3, record: rec(41, Some("m")) }, TxnOffset { group: "g".into(), topic: "app.é".into(), partition: 0, record: rec(2, None) }],
            ends: vec![120, -1],
            previous_producer_id: 3999,
            next_producer_id: -1,
        }
    }

    #[test]
    fn txn_records_round_trip() {
        let fresh = TxnRecord { partitions: vec![], groups: vec![], offsets: vec![], ends: vec![], start_ms: -1, previous_producer_id: -1, ..txn(TxnState::Empty) };
        let states = [TxnState::Empty, TxnState::Ongoing, TxnState::PrepareCommit, TxnState::PrepareAbort, TxnState::CompleteCommit, TxnState::CompleteAbort];
        for t in states.into_iter().map(txn).chain([fresh, TxnRecord { next_producer_id: 5000, epoch: i16::MAX, ..txn(TxnState::PrepareAbort) }]) {
            // Transactional ids are as long as a client makes them.
            for id in ["tx-é".to_string(), "x".repeat(70_000)] {
                round_trips(Record::Txn { id, state: Some(t.clone()) });
            }
        }
        round_trips(Record::Txn { id: "t".into(), state: None });
    }

    #[test]
    fn truncated_oversized_and_malformed_txn_records_are_errors() {
        let (key, value) = encode_record(&Record::Txn { id: "tx".into(), state: Some(txn(TxnState::PrepareCommit)) });
        let value = value.unwrap();
        cut_and_extended_fail(&key, &value);
        let state_at = 1 + 8 + 2 + 2;
        assert_eq!(value[state_at], 2);
        for s in [6u8, 0xff] {
            let mut v = value.clone();
            v[state_at] = s;
            assert!(decode_record(&key, Some(&v)).is_err(), "state {s}");
        }
        // The partition count sits after the state, the timeout and four
        // i64s: far past the value, negative, one more than there is.
        let count_at = state_at + 1 + 4 + 8 * 4;
        assert_eq!(&value[count_at..count_at + 4], &2i32.to_be_bytes());
        for count in [i32::MAX, -1, 3] {
            let mut v = value.clone();
            v[count_at..count_at + 4].copy_from_slice(&count.to_be_bytes());
            assert!(decode_record(&key, Some(&v)).is_err(), "a partition count of {count}");
        }
        // A topic name that is null, or not UTF-8.
        let mut v = value.clone();
        v[count_at + 4..count_at + 8].copy_from_slice(&(-1i32).to_be_bytes());
        assert!(decode_record(&key, Some(&v)).is_err(), "a null topic");
        let mut v = value.clone();
        v[count_at + 8] = 0xff;
        assert!(decode_record(&key, Some(&v)).is_err(), "a topic that is not UTF-8");
        let mut v = value.clone();
        v[0] = 1;
        assert!(decode_record(&key, Some(&v)).is_err(), "an unknown value version");
        // An id length past the key, or negative.
        for len in [i32::MAX, -1] {
            let mut k = vec![KIND_TXN];
            k.extend_from_slice(&len.to_be_bytes());
            k.extend_from_slice(b"tx");
            assert!(decode_record(&k, None).is_err(), "an id length of {len}");
        }
    }

    #[test]
    fn a_transactional_ids_last_record_wins_beside_groups_and_offsets_and_a_tombstone_removes_it() {
        let t = |id: &str, s: TxnState| Record::Txn { id: id.into(), state: Some(txn(s)) };
        let mut log = encode_batch(&[t("a", TxnState::Ongoing), put("g", "t", 0, rec(5, None)), t("b", TxnState::Empty)], 1);
        log.extend_from_slice(&encode_batch(&[t("a", TxnState::PrepareCommit), Record::Txn { id: "b".into(), state: None }, Record::Group { group: "g".into(), state: Some(stored(1, &[])) }], 2));
        let mut shard = Shard::default();
        replay(&mut shard, &log, 1 << 20).unwrap();
        assert_eq!(shard.txns.len(), 1, "b's tombstone removed it");
        assert_eq!(shard.txns["a"], txn(TxnState::PrepareCommit));
        assert_eq!((shard.offsets.len(), shard.groups.len()), (1, 1));
    }

    fn pending(group: &str, topic: &str, p: i32, pid: i64, state: Option<(i16, OffsetRecord)>) -> Record {
        Record::Pending { group: group.into(), topic: topic.into(), partition: p, producer_id: pid, state }
    }

    #[test]
    fn pending_offsets_round_trip_wait_beside_committed_ones_and_end_with_their_tombstones() {
        for r in [pending("gé", "app.events", 4, 4000, Some((7, rec(12, Some("m"))))), pending("g", "t", 0, -1, Some((0, rec(0, None)))), pending("g", "t", 0, 9, None)] {
            round_trips(r);
        }
        // A transaction stages two offsets, another one; the first commits
        // (its offsets and tombstones in one batch), the other stays open.
        let mut log = encode_batch(&[pending("g", "t", 0, 1, Some((3, rec(10, None)))), pending("g", "t", 1, 1, Some((3, rec(20, None)))), pending("g", "t", 0, 2, Some((0, rec(30, None))))], 1);
        log.extend_from_slice(&encode_batch(&[put("g", "t", 0, rec(10, None)), put("g", "t", 1, rec(20, None)), pending("g", "t", 0, 1, None), pending("g", "t", 1, 1, None)], 2));
        let mut shard = Shard::default();
        replay(&mut shard, &log, 1 << 20).unwrap();
        assert_eq!(shard.offsets.len(), 2);
        assert_eq!(shard.pending.into_iter().collect::<Vec<_>>(), vec![(("g".into(), "t".into(), 0, 2), (0, rec(30, None)))]);
    }

    #[test]
    fn fences_round_trip_keep_the_newest_epoch_and_refuse_bad_bytes() {
        let r = Record::Fence { producer_id: 4000, coordinator_epoch: 9 };
        round_trips(r.clone());
        let (key, value) = encode_record(&r);
        let value = value.unwrap();
        cut_and_extended_fail(&key, &value);
        assert!(decode_record(&key, None).is_err(), "a fence without a value");
        let mut log = encode_batch(&[Record::Fence { producer_id: 1, coordinator_epoch: 7 }, Record::Fence { producer_id: 2, coordinator_epoch: 3 }], 1);
        log.extend_from_slice(&encode_batch(&[Record::Fence { producer_id: 1, coordinator_epoch: 5 }], 2));
        let mut shard = Shard::default();
        replay(&mut shard, &log, 1 << 20).unwrap();
        assert_eq!(shard.fences, [(1, 7), (2, 3)].into());
    }

    #[test]
    fn truncated_oversized_and_malformed_pending_offsets_are_errors() {
        let (key, value) = encode_record(&pending("g", "t", 0, 7, Some((3, rec(4, Some("abc"))))));
        let value = value.unwrap();
        cut_and_extended_fail(&key, &value);
        // The metadata length sits after version, epoch, offset, leader
        // epoch and commit time.
        let at = 1 + 2 + 8 + 4 + 8;
        assert_eq!(&value[at..at + 4], &3i32.to_be_bytes());
        for len in [i32::MAX, -2] {
            let mut v = value.clone();
            v[at..at + 4].copy_from_slice(&len.to_be_bytes());
            assert!(decode_record(&key, Some(&v)).is_err(), "a metadata length of {len}");
        }
        let mut v = value.clone();
        v[0] = 1;
        assert!(decode_record(&key, Some(&v)).is_err(), "an unknown value version");
    }

    #[test]
    fn shards_match_the_coordinator_units() {
        for g in ["a", "group-1", "another group"] {
            assert_eq!(crate::cluster::topics::coordinator_unit(g), format!("{}~{}", crate::cluster::topics::COORDINATOR_BRANCH, shard_of(g)));
        }
    }
}
