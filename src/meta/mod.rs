//! The metadata catalog: small, transactional facts kept in sled.
//!
//! Message data never lives here (DESIGN.md: "sled is the catalog, not the
//! log"). Keys are ASCII paths; every value starts with a one-byte encoding
//! version followed by JSON, so a later release can read an older catalog
//! (see the `v1_fixture_loads` test) and change the encoding deliberately.
//!
//! ```text
//! cluster_id                      → v1 JSON string
//! topic/<name>                    → v1 JSON TopicRecord
//! log_start/<topic id hex>/<p>    → v1 JSON i64 (raised by retention)
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

const V1: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("catalog: {0}")]
    Sled(#[from] sled::Error),
    #[error("catalog value under {key} has unknown encoding version {version}")]
    UnknownVersion { key: String, version: u8 },
    #[error("catalog value under {key} does not decode: {why}")]
    Corrupt { key: String, why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub id: [u8; 16],
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
    pub created_ms: i64,
}

pub struct Catalog {
    db: sled::Db,
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

impl Catalog {
    pub fn open(dir: &Path) -> Result<Catalog, MetaError> {
        // No background flusher: every change is followed by an explicit flush,
        // and a lingering flusher thread would hold the lock after close.
        let db = sled::Config::new().path(dir).mode(sled::Mode::HighThroughput).flush_every_ms(None).open()?;
        Ok(Catalog { db })
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

fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_log_starts_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t = TopicRecord { name: "a.b".into(), id: [7; 16], partitions: 3, configs: BTreeMap::new(), created_ms: 5 };
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
