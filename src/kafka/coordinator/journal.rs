//! The coordinator's journal (cluster mode, docs/cluster.md "Replicated
//! state"): every change to committed offsets is first appended to the
//! group's coordinator shard, partition `shard` of the internal topic
//! `__canopy.coordinators`, and applied to this node's catalog only once
//! the shard's in-sync replicas have it. The shard's next leader rebuilds
//! the committed offsets of its groups from that log before it answers
//! for them, so they survive the death of the node that took them.
//!
//! One record per committed offset, keyed by (group, topic, partition) so
//! that the topic's compaction (`cleanup.policy=compact`) keeps the last
//! one; a removal is a tombstone. Both are our own small, versioned
//! encodings:
//!
//! ```text
//! key:   kind u8 (0: offset) | group: u16 len, bytes | topic: u16 len, bytes | partition i32
//! value: version u8 (0) | offset i64 | leader_epoch i32 | commit_ms i64 | metadata: i32 len (-1: null), bytes
//! ```
//!
//! Decoding checks every length against what is there: a record that does
//! not decode fails the shard's load (the log is checksummed, so that is a
//! bug, not a torn write), while a record of a kind this version does not
//! know is passed by (a newer node's).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::meta::OffsetRecord;
use crate::protocol::batch::{self, NewRecord};

/// The record kind of a committed offset.
const KIND_OFFSET: u8 = 0;
const VALUE_VERSION: u8 = 0;

/// One change: `Some` puts the committed offset, `None` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub record: Option<OffsetRecord>,
}

/// What a shard's log says: every committed offset it holds now.
pub type Rows = BTreeMap<(String, String, i32), OffsetRecord>;

/// Where a cluster's coordinator writes its changes before it applies
/// them, and whether it may answer for a shard.
pub trait Journal: Send + Sync + 'static {
    /// Appends `entries` (all of groups in `shard`) to the shard's log and
    /// returns once its in-sync replicas have them; `Err` is the error
    /// code a client gets (Kafka's mapping for offset commits).
    fn append(&self, shard: u32, entries: Vec<Entry>) -> Pin<Box<dyn Future<Output = Result<(), i16>> + Send + '_>>;

    /// Whether this node leads `shard` and has loaded it in its current
    /// leader epoch: its groups may be answered for.
    fn ready(&self, shard: u32) -> bool;

    /// The catalog may not hold what `shard`'s log does (a change appended
    /// but not applied): load the shard again before answering for it.
    fn reload(&self, shard: u32);
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
    let mut out = Vec::with_capacity(1 + 2 + group.len() + 2 + topic.len() + 4);
    out.push(KIND_OFFSET);
    put_str(&mut out, group);
    put_str(&mut out, topic);
    out.extend_from_slice(&partition.to_be_bytes());
    out
}

pub fn encode_value(r: &OffsetRecord) -> Vec<u8> {
    let meta = r.metadata.as_deref().map(str::as_bytes);
    let mut out = Vec::with_capacity(1 + 8 + 4 + 8 + 4 + meta.map_or(0, <[u8]>::len));
    out.push(VALUE_VERSION);
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
    out
}

/// `entries` as one uncompressed batch (the log assigns its offsets).
pub fn encode_batch(entries: &[Entry], now_ms: i64) -> Vec<u8> {
    let keys: Vec<Vec<u8>> = entries.iter().map(|e| encode_key(&e.group, &e.topic, e.partition)).collect();
    let values: Vec<Option<Vec<u8>>> = entries.iter().map(|e| e.record.as_ref().map(encode_value)).collect();
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
    fn short_string(&mut self) -> Result<String, String> {
        let len = u16::from_be_bytes(self.bytes(2)?.try_into().expect("2 bytes"));
        self.string(len as usize)
    }
    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes past the end", self.0.len()))
        }
    }
}

/// One record's (key, value) as an entry; `Ok(None)` for a record of a
/// kind this version does not know.
pub fn decode_record(key: &[u8], value: Option<&[u8]>) -> Result<Option<Entry>, String> {
    let mut k = Take(key);
    if k.u8()? != KIND_OFFSET {
        return Ok(None);
    }
    let group = k.short_string()?;
    let topic = k.short_string()?;
    let partition = k.i32()?;
    k.end()?;
    let record = match value {
        None => None,
        Some(v) => {
            let mut v = Take(v);
            let version = v.u8()?;
            if version != VALUE_VERSION {
                return Err(format!("offset value version {version}"));
            }
            let offset = v.i64()?;
            let leader_epoch = v.i32()?;
            let commit_ms = v.i64()?;
            let metadata = match v.i32()? {
                -1 => None,
                n if n >= 0 => Some(v.string(n as usize)?),
                n => return Err(format!("metadata length {n}")),
            };
            v.end()?;
            Some(OffsetRecord { offset, leader_epoch, metadata, commit_ms })
        }
    };
    Ok(Some(Entry { group, topic, partition, record }))
}

/// Applies every record of `batches` (whole batches as the log holds
/// them, in offset order) to `rows`. Control batches are passed by.
/// `max_bytes` bounds what one batch may inflate to.
pub fn replay(rows: &mut Rows, batches: &[u8], max_bytes: usize) -> Result<(), String> {
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
            let Some(e) = decode_record(key, r.value)? else { continue };
            let at = (e.group, e.topic, e.partition);
            match e.record {
                Some(rec) => rows.insert(at, rec),
                None => rows.remove(&at),
            };
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

    fn put(group: &str, topic: &str, p: i32, r: OffsetRecord) -> Entry {
        Entry { group: group.into(), topic: topic.into(), partition: p, record: Some(r) }
    }

    #[test]
    fn the_last_change_per_key_wins_and_tombstones_remove() {
        let first = encode_batch(&[put("g", "t", 0, rec(5, None)), put("g", "t", 1, rec(7, Some("m"))), put("h", "t", 0, rec(1, Some("")))], 1);
        let second = encode_batch(&[put("g", "t", 0, rec(9, None)), Entry { group: "h".into(), topic: "t".into(), partition: 0, record: None }], 2);
        let mut log = first.clone();
        log.extend_from_slice(&second);
        let mut rows = Rows::new();
        replay(&mut rows, &log, 1 << 20).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[&("g".into(), "t".into(), 0)], rec(9, None));
        assert_eq!(rows[&("g".into(), "t".into(), 1)], rec(7, Some("m")));
    }

    #[test]
    fn records_round_trip_and_unknown_kinds_are_passed_by() {
        let e = put("group-é", "app.events", 11, rec(-1, Some("meta")));
        let key = encode_key(&e.group, &e.topic, e.partition);
        let value = encode_value(e.record.as_ref().unwrap());
        assert_eq!(decode_record(&key, Some(&value)).unwrap(), Some(e.clone()));
        assert_eq!(decode_record(&key, None).unwrap(), Some(Entry { record: None, ..e }));
        let mut other = key.clone();
        other[0] = 7;
        assert_eq!(decode_record(&other, Some(b"whatever")).unwrap(), None);
    }

    #[test]
    fn truncated_oversized_and_malformed_records_are_errors() {
        let key = encode_key("g", "t", 0);
        let value = encode_value(&rec(4, Some("abc")));
        for n in 0..key.len() {
            assert!(decode_record(&key[..n], Some(&value)).is_err(), "key cut at {n}");
        }
        for n in 0..value.len() {
            assert!(decode_record(&key, Some(&value[..n])).is_err(), "value cut at {n}");
        }
        let mut long = key.clone();
        long.push(0);
        assert!(decode_record(&long, Some(&value)).is_err(), "a byte past the key's end");
        let mut long = value.clone();
        long.push(0);
        assert!(decode_record(&key, Some(&long)).is_err(), "a byte past the value's end");
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
        let mut rows = Rows::new();
        assert!(replay(&mut rows, &log[..log.len() - 1], 1 << 20).is_err(), "a torn batch");
        let keyless = batch::build(&[NewRecord { key: None, value: Some(b"x"), headers: Vec::new() }], 1);
        assert!(replay(&mut rows, &keyless, 1 << 20).is_err(), "a record without a key");
        let mut flipped = log.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(replay(&mut rows, &flipped, 1 << 20).is_err(), "a CRC that does not match");
        assert!(rows.is_empty(), "nothing applied from a bad log");
    }

    #[test]
    fn shards_match_the_coordinator_units() {
        for g in ["a", "group-1", "another group"] {
            assert_eq!(crate::cluster::topics::coordinator_unit(g), format!("{}~{}", crate::cluster::topics::COORDINATOR_BRANCH, shard_of(g)));
        }
    }
}
