//! Topic names and typed topic configuration.
//!
//! Kafka clients send configs as string pairs; they are parsed once, here,
//! into [`TopicConfig`], and an invalid value is refused with the key named.

use std::collections::BTreeMap;

/// Kafka's own limit on topic name length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("topic name is empty")]
    Empty,
    #[error("topic name is longer than {MAX_TOPIC_NAME_LEN} characters")]
    TooLong,
    #[error("topic name cannot be '.' or '..'")]
    Dots,
    #[error("topic name {0:?} contains characters other than [a-zA-Z0-9._-]")]
    BadChar(String),
    #[error("topic name {0:?} has a segment starting with \"__\", reserved for the broker's virtual topics")]
    Reserved(String),
}

/// Checks a topic name with Kafka's rules.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(NameError::TooLong);
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots);
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return Err(NameError::BadChar(name.to_owned()));
    }
    // `<prefix>.__all` and the like name read-only views of the topic tree.
    if name.split('.').any(|seg| seg.starts_with("__")) {
        return Err(NameError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// A topic's `compression.type`: keep what the producer sent, or store
/// every batch with this codec (recompressing on append: a slow path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicCompression {
    Producer,
    Codec(crate::protocol::batch::Compression),
}

impl TopicCompression {
    fn parse(v: &str) -> Option<TopicCompression> {
        use crate::protocol::batch::Compression as C;
        Some(match v {
            "producer" => TopicCompression::Producer,
            "uncompressed" => TopicCompression::Codec(C::None),
            "gzip" => TopicCompression::Codec(C::Gzip),
            "snappy" => TopicCompression::Codec(C::Snappy),
            "lz4" => TopicCompression::Codec(C::Lz4),
            "zstd" => TopicCompression::Codec(C::Zstd),
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        use crate::protocol::batch::Compression as C;
        match self {
            TopicCompression::Producer => "producer",
            TopicCompression::Codec(C::None | C::Unknown(_)) => "uncompressed",
            TopicCompression::Codec(C::Gzip) => "gzip",
            TopicCompression::Codec(C::Snappy) => "snappy",
            TopicCompression::Codec(C::Lz4) => "lz4",
            TopicCompression::Codec(C::Zstd) => "zstd",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// Broker-wide defaults for topic configs (Kafka's `log.*` settings).
#[derive(Debug, Clone)]
pub struct TopicDefaults {
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub max_message_bytes: i32,
    /// The largest max.message.bytes a topic may set: no batch can be
    /// larger than a request (max_request_bytes) or a segment.
    pub max_message_bytes_limit: i32,
    pub timestamp_type: TimestampType,
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            max_message_bytes_limit: 100 << 20,
            timestamp_type: TimestampType::CreateTime,
            // Kafka 4's defaults: any age, at most an hour ahead.
            timestamp_before_max_ms: i64::MAX,
            timestamp_after_max_ms: 3_600_000,
        }
    }
}

/// The configs Canopy acts on, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub max_message_bytes: i32,
    pub timestamp_type: TimestampType,
    /// CreateTime records older / newer than this (relative to the
    /// broker's clock) are refused with INVALID_TIMESTAMP.
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
    pub compression: TopicCompression,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for topic config {key}: {why}")]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub why: &'static str,
}

/// Topic configs a client may set. The first group is acted on; the second
/// is accepted and reported back (Kafka clients and tools set them on
/// creation) but has no effect on a single-node broker, as documented in the
/// README.
pub const ACTED_ON: &[&str] = &[
    "retention.ms",
    "retention.bytes",
    "max.message.bytes",
    "message.timestamp.type",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "compression.type",
];
pub const ACCEPTED: &[&str] = &[
    "cleanup.policy",
    "min.insync.replicas",
    "segment.bytes",
    "segment.ms",
    "unclean.leader.election.enable",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "delete.retention.ms",
    "flush.messages",
    "flush.ms",
    "segment.index.bytes",
    "index.interval.bytes",
    "file.delete.delay.ms",
    "preallocate",
    "message.downconversion.enable",
];

impl TopicConfig {
    /// Parses the stored string configs over the broker defaults.
    pub fn parse(configs: &BTreeMap<String, String>, d: &TopicDefaults) -> Result<TopicConfig, ConfigError> {
        let mut c = TopicConfig {
            retention_ms: d.retention_ms,
            retention_bytes: d.retention_bytes,
            max_message_bytes: d.max_message_bytes,
            timestamp_type: d.timestamp_type,
            timestamp_before_max_ms: d.timestamp_before_max_ms,
            timestamp_after_max_ms: d.timestamp_after_max_ms,
            compression: TopicCompression::Producer,
        };
        for (key, value) in configs {
            let bad = |why| ConfigError { key: key.clone(), value: value.clone(), why };
            match key.as_str() {
                "retention.ms" => c.retention_ms = parse_at_least(value, -1).ok_or_else(|| bad("expected an integer ≥ -1"))?,
                "retention.bytes" => c.retention_bytes = parse_at_least(value, -1).ok_or_else(|| bad("expected an integer ≥ -1"))?,
                "max.message.bytes" => {
                    c.max_message_bytes = value.parse::<i32>().ok().filter(|v| *v > 0).ok_or_else(|| bad("expected a positive integer"))?;
                    if c.max_message_bytes > d.max_message_bytes_limit {
                        return Err(ConfigError { key: key.clone(), value: value.clone(), why: "larger than a request may be (max_request_bytes) or a segment (segment_bytes)" });
                    }
                }
                "message.timestamp.type" => {
                    c.timestamp_type = match value.as_str() {
                        "CreateTime" => TimestampType::CreateTime,
                        "LogAppendTime" => TimestampType::LogAppendTime,
                        _ => return Err(bad("expected CreateTime or LogAppendTime")),
                    }
                }
                "message.timestamp.before.max.ms" => c.timestamp_before_max_ms = parse_at_least(value, 0).ok_or_else(|| bad("expected an integer ≥ 0"))?,
                "message.timestamp.after.max.ms" => c.timestamp_after_max_ms = parse_at_least(value, 0).ok_or_else(|| bad("expected an integer ≥ 0"))?,
                "compression.type" => {
                    c.compression = TopicCompression::parse(value).ok_or_else(|| bad("expected producer, uncompressed, gzip, snappy, lz4 or zstd"))?
                }
                k if ACCEPTED.contains(&k) => {}
                _ => return Err(bad("unknown topic config")),
            }
        }
        Ok(c)
    }

    /// Every config key with its effective value and whether it is a default.
    pub fn describe(&self, set: &BTreeMap<String, String>) -> Vec<(String, String, bool)> {
        let ts = match self.timestamp_type {
            TimestampType::CreateTime => "CreateTime",
            TimestampType::LogAppendTime => "LogAppendTime",
        };
        let mut out = vec![
            ("retention.ms".to_owned(), self.retention_ms.to_string()),
            ("retention.bytes".to_owned(), self.retention_bytes.to_string()),
            ("max.message.bytes".to_owned(), self.max_message_bytes.to_string()),
            ("message.timestamp.type".to_owned(), ts.to_owned()),
            ("message.timestamp.before.max.ms".to_owned(), self.timestamp_before_max_ms.to_string()),
            ("message.timestamp.after.max.ms".to_owned(), self.timestamp_after_max_ms.to_string()),
            ("cleanup.policy".to_owned(), "delete".to_owned()),
            ("compression.type".to_owned(), self.compression.name().to_owned()),
            ("min.insync.replicas".to_owned(), "1".to_owned()),
        ];
        for (k, v) in set {
            if let Some(e) = out.iter_mut().find(|(key, _)| key == k) {
                e.1 = v.clone();
            } else {
                out.push((k.clone(), v.clone()));
            }
        }
        out.into_iter().map(|(k, v)| { let default = !set.contains_key(&k); (k, v, default) }).collect()
    }
}

fn parse_at_least(v: &str, min: i64) -> Option<i64> {
    v.parse::<i64>().ok().filter(|x| *x >= min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kafka_rules() {
        assert!(validate_name("app.codestore.commits").is_ok());
        assert!(validate_name("a-b_c.9").is_ok());
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name(".."), Err(NameError::Dots));
        assert!(matches!(validate_name("a b"), Err(NameError::BadChar(_))));
        assert!(matches!(validate_name("naïve"), Err(NameError::BadChar(_))));
        assert_eq!(validate_name(&"x".repeat(250)), Err(NameError::TooLong));
        assert!(validate_name(&"x".repeat(249)).is_ok());
        for reserved in ["__all", "app.__all", "app.x.__consumer_offsets", "__"] {
            assert!(matches!(validate_name(reserved), Err(NameError::Reserved(_))), "{reserved}");
        }
        assert!(validate_name("app._one.x_").is_ok(), "one underscore is an ordinary name");
    }

    #[test]
    fn configs_parse_and_name_the_bad_key() {
        let d = TopicDefaults::default();
        let mut m = BTreeMap::new();
        m.insert("retention.ms".into(), "1000".into());
        m.insert("message.timestamp.type".into(), "LogAppendTime".into());
        m.insert("cleanup.policy".into(), "delete".into());
        let c = TopicConfig::parse(&m, &d).unwrap();
        assert_eq!(c.retention_ms, 1000);
        assert_eq!(c.timestamp_type, TimestampType::LogAppendTime);
        m.insert("retention.bytes".into(), "lots".into());
        assert_eq!(TopicConfig::parse(&m, &d).unwrap_err().key, "retention.bytes");
        let mut u = BTreeMap::new();
        u.insert("no.such.config".into(), "1".into());
        assert_eq!(TopicConfig::parse(&u, &d).unwrap_err().key, "no.such.config");
    }
}
