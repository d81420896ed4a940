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
    if is_internal(name) {
        return Err(NameError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// Whether `name` is an internal topic's (a segment starting with `__`,
/// which clients cannot create: cluster mode's `__canopy.coordinators`).
/// Listings leave them out, and clients cannot delete or grow them.
pub fn is_internal(name: &str) -> bool {
    name.split('.').any(|seg| seg.starts_with("__"))
}

/// A topic's `compression.type`: keep what the producer sent, or store
/// every batch with this codec (recompressing on append: a slow path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicCompression {
    Producer,
    Codec(crate::protocol::batch::Compression),
}

impl TopicCompression {
    pub(super) fn parse(v: &str) -> Option<TopicCompression> {
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// The operator's static settings for topic defaults, and the bound on
/// max.message.bytes that no layer may pass.
#[derive(Debug, Clone)]
pub struct TopicDefaults {
    /// Kafka broker keys (`log.retention.ms`, …) the configuration file,
    /// environment or flags set, with their values (STATIC_BROKER_CONFIG).
    pub statics: BTreeMap<String, String>,
    /// The largest max.message.bytes a topic may set: no batch can be
    /// larger than a request (max_request_bytes) or a segment.
    pub max_message_bytes_limit: i32,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults { statics: BTreeMap::new(), max_message_bytes_limit: 100 << 20 }
    }
}

/// `cleanup.policy`: delete old data by retention, keep the latest record
/// per key, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleanup {
    pub delete: bool,
    pub compact: bool,
}

/// The configs Canopy acts on, parsed (see `configs` for the table they
/// come from and the layers that set them).
#[derive(Debug, Clone, PartialEq)]
pub struct TopicConfig {
    pub cleanup: Cleanup,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub max_message_bytes: i32,
    pub timestamp_type: TimestampType,
    /// CreateTime records older / newer than this (relative to the
    /// broker's clock) are refused with INVALID_TIMESTAMP.
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
    pub compression: TopicCompression,
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    pub min_cleanable_dirty_ratio: f64,
    /// Cluster mode: acks=all needs this many in-sync replicas.
    pub min_insync_replicas: i32,
}

impl TopicConfig {
    /// Every field set; `configs::TopicConfig::kafka_default` then assigns
    /// each from the table's defaults.
    pub(super) fn placeholder() -> TopicConfig {
        TopicConfig {
            cleanup: Cleanup { delete: true, compact: false },
            retention_ms: -1,
            retention_bytes: -1,
            max_message_bytes: 0,
            timestamp_type: TimestampType::CreateTime,
            timestamp_before_max_ms: i64::MAX,
            timestamp_after_max_ms: i64::MAX,
            compression: TopicCompression::Producer,
            delete_retention_ms: 0,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ratio: 0.5,
            min_insync_replicas: 1,
        }
    }
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
}
