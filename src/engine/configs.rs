//! Topic and broker configuration as Kafka's admin APIs see it.
//!
//! One table, [`TOPIC_CONFIGS`], declares every topic config Canopy knows:
//! its Kafka type and default, the values it accepts, the broker-wide key
//! that supplies its default, and whether Canopy acts on it. Parsing,
//! validation, DescribeConfigs (types, synonyms, documentation) and the
//! edits of IncrementalAlterConfigs and AlterConfigs all read that table,
//! so a key cannot be accepted by one and unknown to another.
//!
//! A topic's effective value comes from the first layer that sets it:
//!
//! ```text
//!  1. the topic's own configs      TopicRecord.configs       DYNAMIC_TOPIC_CONFIG (1)
//!  2. dynamic, this broker         BROKER "0"   (catalog)    DYNAMIC_BROKER_CONFIG (2)
//!  3. dynamic, cluster default     BROKER ""    (catalog)    DYNAMIC_DEFAULT_BROKER_CONFIG (3)
//!  4. the static configuration     file / env / flags        STATIC_BROKER_CONFIG (4)
//!  5. Kafka's default              this table                DEFAULT_CONFIG (5)
//! ```
//!
//! Layers 2–5 are folded once into a parsed default [`TopicConfig`]; a
//! topic's config is that default with its own layer over it. A change to
//! layer 2 or 3 re-derives every topic's parsed config under the engine's
//! admin lock, so produce and retention see it the next
//! time they look a topic up. The rejected alternative, resolving layers
//! at each use, would put five map look-ups on every produce.
//!
//! Keys Canopy does not act on (replication, flushing, index sizing) are
//! still validated with Kafka's types and ranges and reported back, since
//! tools set them when they create topics; docs/configs.md says which.

use std::collections::BTreeMap;

use super::topics::{TimestampType, TopicCompression, TopicConfig};

/// A config's type, numbered as DescribeConfigs v3+ reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum Kind {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// The values a config accepts.
#[derive(Debug, Clone, Copy)]
pub enum Valid {
    /// A 64-bit integer at least this.
    Long(i64),
    /// A 32-bit integer at least this.
    Int(i32),
    /// A number in [0, 1].
    Ratio,
    Bool,
    OneOf(&'static [&'static str]),
    /// A comma-separated, non-empty list of these.
    SubsetOf(&'static [&'static str]),
}

impl Valid {
    pub fn kind(self) -> Kind {
        match self {
            Valid::Long(_) => Kind::Long,
            Valid::Int(_) => Kind::Int,
            Valid::Ratio => Kind::Double,
            Valid::Bool => Kind::Boolean,
            Valid::OneOf(_) => Kind::String,
            Valid::SubsetOf(_) => Kind::List,
        }
    }

    /// Why `value` is not accepted, worded as Kafka's ConfigDef words it.
    fn refuse(self, value: &str) -> Option<String> {
        let v = value.trim();
        match self {
            Valid::Long(min) => match v.parse::<i64>() {
                Err(_) => Some("Not a number of type LONG".into()),
                Ok(x) if x < min => Some(format!("Value must be at least {min}")),
                Ok(_) => None,
            },
            Valid::Int(min) => match v.parse::<i32>() {
                Err(_) => Some("Not a number of type INT".into()),
                Ok(x) if x < min => Some(format!("Value must be at least {min}")),
                Ok(_) => None,
            },
            Valid::Ratio => match v.parse::<f64>() {
                Ok(x) if x.is_nan() => Some("Not a number of type DOUBLE".into()),
                Err(_) => Some("Not a number of type DOUBLE".into()),
                Ok(x) if x < 0.0 => Some("Value must be at least 0".into()),
                Ok(x) if x > 1.0 => Some("Value must be no more than 1".into()),
                Ok(_) => None,
            },
            Valid::Bool => (!v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false")).then(|| "Expected value to be either true or false".into()),
            Valid::OneOf(options) => (!options.contains(&v)).then(|| format!("String must be one of: {}", options.join(", "))),
            Valid::SubsetOf(options) => {
                let items = list(v);
                if items.is_empty() {
                    Some("The list must not be empty".into())
                } else {
                    items.iter().find(|i| !options.contains(i)).map(|_| format!("String must be one of: {}", options.join(", ")))
                }
            }
        }
    }
}

/// The items of a list value, trimmed, without empty ones.
pub fn list(v: &str) -> Vec<&str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
}

/// One topic config.
#[derive(Debug)]
pub struct Def {
    pub name: &'static str,
    /// The broker config that supplies its default (Kafka's first synonym).
    pub broker: &'static str,
    pub valid: Valid,
    /// Kafka's default, as DescribeConfigs shows it.
    pub default: &'static str,
    /// Whether the broker key may change at run time (AlterConfigs on the
    /// broker); the others need a restart with the static setting.
    pub broker_dynamic: bool,
    /// Whether the value is parsed into [`TopicConfig`] (else it is only
    /// checked, kept and reported).
    pub acted: bool,
    pub doc: &'static str,
}

const LONG_MAX: &str = "9223372036854775807";

/// Every topic config Canopy knows, by name. Types, defaults and ranges
/// follow Kafka 4's LogConfig (`min.insync.replicas` and friends: see
/// `acted`).
pub const TOPIC_CONFIGS: &[Def] = &[
    Def { name: "cleanup.policy", broker: "log.cleanup.policy", valid: Valid::SubsetOf(&["compact", "delete"]), default: "delete", broker_dynamic: true, acted: true,
        doc: "delete: old data goes by retention.ms and retention.bytes; compact: records need keys, and the latest record per key is kept (older ones go once the data is in subtree stores, not by time or size); both: compacted, and old data still goes by retention." },
    Def { name: "compression.type", broker: "compression.type", valid: Valid::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]), default: "producer", broker_dynamic: true, acted: true,
        doc: "Codec the topic stores batches in; producer keeps what the producer sent (other codecs recompress on append)." },
    Def { name: "delete.retention.ms", broker: "log.cleaner.delete.retention.ms", valid: Valid::Long(0), default: "86400000", broker_dynamic: true, acted: true,
        doc: "How long a tombstone (a record with a null value) of a compacted topic stays readable after the cleaning that first kept it." },
    Def { name: "file.delete.delay.ms", broker: "log.segment.delete.delay.ms", valid: Valid::Long(0), default: "60000", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; Canopy deletes files once no reader holds them." },
    Def { name: "flush.messages", broker: "log.flush.interval.messages", valid: Valid::Long(1), default: LONG_MAX, broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; fsync is the broker-wide flush policy." },
    Def { name: "flush.ms", broker: "log.flush.interval.ms", valid: Valid::Long(0), default: LONG_MAX, broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; fsync is the broker-wide flush policy." },
    Def { name: "index.interval.bytes", broker: "log.index.interval.bytes", valid: Valid::Int(0), default: "4096", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; Canopy indexes every batch." },
    Def { name: "max.compaction.lag.ms", broker: "log.cleaner.max.compaction.lag.ms", valid: Valid::Long(1), default: LONG_MAX, broker_dynamic: true, acted: true,
        doc: "A compacted topic is cleaned, whatever its dirty ratio, once its oldest uncleaned store data is this old (by record timestamps; data still in branch segments waits for compaction into stores)." },
    Def { name: "max.message.bytes", broker: "message.max.bytes", valid: Valid::Int(0), default: "1048588", broker_dynamic: true, acted: true,
        doc: "Largest record batch the topic accepts, as sent (compressed)." },
    Def { name: "message.downconversion.enable", broker: "log.message.downconversion.enable", valid: Valid::Bool, default: "true", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; Canopy serves record batch v2 only." },
    Def { name: "message.timestamp.after.max.ms", broker: "log.message.timestamp.after.max.ms", valid: Valid::Long(0), default: "3600000", broker_dynamic: true, acted: true,
        doc: "CreateTime records further ahead of the broker's clock than this are refused (INVALID_TIMESTAMP)." },
    Def { name: "message.timestamp.before.max.ms", broker: "log.message.timestamp.before.max.ms", valid: Valid::Long(0), default: LONG_MAX, broker_dynamic: true, acted: true,
        doc: "CreateTime records older than this by the broker's clock are refused (INVALID_TIMESTAMP)." },
    Def { name: "message.timestamp.type", broker: "log.message.timestamp.type", valid: Valid::OneOf(&["CreateTime", "LogAppendTime"]), default: "CreateTime", broker_dynamic: true, acted: true,
        doc: "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the broker's clock." },
    Def { name: "min.cleanable.dirty.ratio", broker: "log.cleaner.min.cleanable.ratio", valid: Valid::Ratio, default: "0.5", broker_dynamic: true, acted: true,
        doc: "A compacted topic is cleaned once more than this share of its stored bytes was written since its last cleaning." },
    Def { name: "min.compaction.lag.ms", broker: "log.cleaner.min.compaction.lag.ms", valid: Valid::Long(0), default: "0", broker_dynamic: true, acted: true,
        doc: "A record of a compacted topic stays uncleaned at least this long after it was written (by its store's newest timestamp)." },
    Def { name: "min.insync.replicas", broker: "min.insync.replicas", valid: Valid::Int(1), default: "1", broker_dynamic: true, acted: true,
        doc: "Cluster mode: an acks=all produce is refused (NOT_ENOUGH_REPLICAS) while fewer replicas than this are in sync, and the high watermark waits meanwhile. A single node is its only replica." },
    Def { name: "preallocate", broker: "log.preallocate", valid: Valid::Bool, default: "false", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; branch logs are shared by the topics of a branch." },
    Def { name: "retention.bytes", broker: "log.retention.bytes", valid: Valid::Long(i64::MIN), default: "-1", broker_dynamic: true, acted: true,
        doc: "Largest size of a partition before its oldest data is deleted (negative: no limit; delete policy only)." },
    Def { name: "retention.ms", broker: "log.retention.ms", valid: Valid::Long(-1), default: "604800000", broker_dynamic: true, acted: true,
        doc: "How long data is kept before it is deleted (-1: forever; delete policy only)." },
    Def { name: "segment.bytes", broker: "log.segment.bytes", valid: Valid::Int(1 << 20), default: "1073741824", broker_dynamic: false, acted: false,
        doc: "Accepted for compatibility; the topics of a branch share segments, rolled at the broker's segment_bytes." },
    Def { name: "segment.index.bytes", broker: "log.index.size.max.bytes", valid: Valid::Int(4), default: "10485760", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; Canopy sizes its indexes itself." },
    Def { name: "segment.jitter.ms", broker: "log.roll.jitter.ms", valid: Valid::Long(0), default: "0", broker_dynamic: true, acted: false,
        doc: "Accepted for compatibility; branch segments roll at the broker's segment_ms." },
    Def { name: "segment.ms", broker: "log.roll.ms", valid: Valid::Long(1), default: "604800000", broker_dynamic: false, acted: false,
        doc: "Accepted for compatibility; the topics of a branch share segments, rolled at the broker's segment_ms." },
    Def { name: "unclean.leader.election.enable", broker: "unclean.leader.election.enable", valid: Valid::Bool, default: "false", broker_dynamic: true, acted: false,
        doc: "Cluster mode: when no in-sync replica of a partition is left, the controller may elect a live out-of-sync one (records only the lost replicas had are gone); every topic sharing the partition's log must allow it. A single node has no other replica." },
];

const _: () = {
    // Sorted and unique, so look-ups can search.
    let mut i = 1;
    while i < TOPIC_CONFIGS.len() {
        let (a, b) = (TOPIC_CONFIGS[i - 1].name.as_bytes(), TOPIC_CONFIGS[i].name.as_bytes());
        let mut j = 0;
        while j < a.len() && j < b.len() && a[j] == b[j] {
            j += 1;
        }
        assert!(j < b.len() && (j == a.len() || a[j] < b[j]), "TOPIC_CONFIGS must be sorted by name");
        i += 1;
    }
};

/// The topic config named `name`.
pub fn topic_def(name: &str) -> Option<&'static Def> {
    TOPIC_CONFIGS.binary_search_by(|d| d.name.cmp(name)).ok().map(|i| &TOPIC_CONFIGS[i])
}

/// The topic config whose default the broker key `key` supplies.
pub fn broker_def(key: &str) -> Option<&'static Def> {
    TOPIC_CONFIGS.iter().find(|d| d.broker == key)
}

/// Why a config value or edit is refused, with the key named, worded as
/// Kafka words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn invalid(key: &str, value: &str, why: &str) -> ConfigError {
        ConfigError { key: key.to_owned(), message: format!("Invalid value {value} for configuration {key}: {why}") }
    }
    fn unknown(key: &str) -> ConfigError {
        ConfigError { key: key.to_owned(), message: format!("Unknown topic config name: {key}") }
    }
}

/// Checks a new dynamic broker value strictly (the broker key of a
/// topic config, with `limit` bounding message.max.bytes).
pub fn check_broker_value(key: &str, value: &str, limit: i32) -> Result<(), ConfigError> {
    let def = broker_def(key).ok_or_else(|| ConfigError { key: key.to_owned(), message: format!("Unknown broker config name: {key}") })?;
    check(def, key, value)?;
    TopicConfig::kafka_default().assign(def, key, value, limit)
}

/// Checks one value of a known config.
pub fn check(def: &Def, key: &str, value: &str) -> Result<(), ConfigError> {
    match def.valid.refuse(value) {
        Some(why) => Err(ConfigError::invalid(key, value, &why)),
        None => Ok(()),
    }
}

/// Where a value came from, numbered as DescribeConfigs reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum Source {
    Topic = 1,
    DynamicBroker = 2,
    DynamicDefault = 3,
    Static = 4,
    Default = 5,
}

/// One described config: its value and the layers that set it, most
/// specific first (the first is the one in effect).
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub name: String,
    pub value: String,
    pub source: Source,
    pub read_only: bool,
    pub kind: Kind,
    pub doc: &'static str,
    pub synonyms: Vec<(String, String, Source)>,
}

/// A broker config resource: BROKER "" (every broker's default) or this
/// broker's own id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerScope {
    Cluster,
    Node,
}

impl BrokerScope {
    /// Where the catalog keeps the scope's configs.
    pub fn catalog_key(self) -> &'static str {
        match self {
            BrokerScope::Cluster => "default",
            BrokerScope::Node => "node",
        }
    }
}

/// The broker-level layers: the operator's static settings and the two
/// dynamic ones, each keyed by broker config name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerLayers {
    /// Set in the configuration file, environment or flags.
    pub statics: BTreeMap<String, String>,
    /// BROKER "" (every broker's default).
    pub cluster: BTreeMap<String, String>,
    /// BROKER "<node id>" (this broker).
    pub node: BTreeMap<String, String>,
}

impl BrokerLayers {
    /// The dynamic layer of `scope`.
    pub fn scope_mut(&mut self, scope: BrokerScope) -> &mut BTreeMap<String, String> {
        match scope {
            BrokerScope::Cluster => &mut self.cluster,
            BrokerScope::Node => &mut self.node,
        }
    }

    /// The layers that set `def`'s broker key, most specific first, ending
    /// with Kafka's default.
    fn synonyms(&self, def: &Def) -> Vec<(String, String, Source)> {
        let mut out = Vec::with_capacity(2);
        for (layer, source) in [(&self.node, Source::DynamicBroker), (&self.cluster, Source::DynamicDefault), (&self.statics, Source::Static)] {
            if let Some(v) = layer.get(def.broker) {
                out.push((def.broker.to_owned(), v.clone(), source));
            }
        }
        out.push((def.broker.to_owned(), def.default.to_owned(), Source::Default));
        out
    }

    /// The parsed topic default: Kafka's defaults with the static, cluster
    /// and node layers over them; `limit` bounds max.message.bytes.
    ///
    /// Lenient, as for anything already stored: a value that no longer
    /// passes (kept before a check existed, or over a limit lowered since)
    /// is left out and returned, so the broker still starts; a
    /// max.message.bytes over `limit` is capped. New values are checked
    /// strictly before they are stored ([`check_broker_value`]).
    pub fn topic_default(&self, limit: i32) -> (TopicConfig, Vec<ConfigError>) {
        let mut c = TopicConfig::kafka_default();
        let mut skipped = Vec::new();
        for (layer, statics) in [(&self.statics, true), (&self.cluster, false), (&self.node, false)] {
            for (key, value) in layer {
                let Some(def) = broker_def(key) else { continue };
                // The static segment settings are the branch logs' own,
                // checked by the configuration with their own bounds.
                if statics && !def.acted {
                    continue;
                }
                if let Err(e) = check(def, key, value).and_then(|()| c.assign(def, key, value, i32::MAX)) {
                    skipped.push(e);
                }
            }
        }
        c.max_message_bytes = c.max_message_bytes.min(limit);
        if let Err(e) = c.check_relations() {
            let base = TopicConfig::kafka_default();
            (c.min_compaction_lag_ms, c.max_compaction_lag_ms) = (base.min_compaction_lag_ms, base.max_compaction_lag_ms);
            skipped.push(e);
        }
        (c, skipped)
    }

    /// Every config of a topic whose own layer is `set`.
    pub fn describe_topic(&self, set: &BTreeMap<String, String>) -> Vec<Described> {
        TOPIC_CONFIGS
            .iter()
            .map(|def| {
                let mut synonyms = self.synonyms(def);
                if let Some(v) = set.get(def.name) {
                    synonyms.insert(0, (def.name.to_owned(), v.clone(), Source::Topic));
                }
                let (_, value, source) = synonyms[0].clone();
                Described { name: def.name.to_owned(), value, source, read_only: false, kind: def.valid.kind(), doc: def.doc, synonyms }
            })
            .collect()
    }

    /// The topic-default configs of this broker (`cluster_only`: of the
    /// cluster-wide default resource, BROKER "", which shows only what it
    /// sets).
    pub fn describe_broker(&self, cluster_only: bool) -> Vec<Described> {
        let mut out: Vec<Described> = TOPIC_CONFIGS
            .iter()
            .filter(|def| !cluster_only || self.cluster.contains_key(def.broker))
            .map(|def| {
                let mut synonyms = self.synonyms(def);
                if cluster_only {
                    synonyms.retain(|s| s.2 == Source::DynamicDefault);
                }
                let (_, value, source) = synonyms[0].clone();
                Described { name: def.broker.to_owned(), value, source, read_only: !def.broker_dynamic, kind: def.valid.kind(), doc: def.doc, synonyms }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// An IncrementalAlterConfigs operation (its `config_operation` 0–3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Set(String, String),
    Delete(String),
    Append(String, String),
    Subtract(String, String),
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Set(k, _) | Op::Delete(k) | Op::Append(k, _) | Op::Subtract(k, _) => k,
        }
    }
}

/// How a resource's configs change: edited key by key
/// (IncrementalAlterConfigs), or replaced as a whole (AlterConfigs: keys
/// not given return to their defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alter {
    Incremental(Vec<Op>),
    Replace(BTreeMap<String, String>),
}

impl Alter {
    /// The configs after the change. `def_of` finds a key's definition
    /// (for APPEND and SUBTRACT, which need a list, and start from the
    /// default when the key is not set). Keys are not checked here beyond
    /// that; the caller parses the result.
    pub fn apply(self, current: &BTreeMap<String, String>, def_of: impl Fn(&str) -> Option<&'static Def>) -> Result<BTreeMap<String, String>, ConfigError> {
        let ops = match self {
            Alter::Replace(all) => return Ok(all),
            Alter::Incremental(ops) => ops,
        };
        let mut out = current.clone();
        for op in ops {
            match op {
                Op::Set(k, v) => {
                    out.insert(k, v);
                }
                Op::Delete(k) => {
                    out.remove(&k);
                }
                Op::Append(ref k, _) | Op::Subtract(ref k, _) if def_of(k).is_none_or(|d| d.valid.kind() != Kind::List) => {
                    let verb = if matches!(op, Op::Append(..)) { "APPEND" } else { "SUBTRACT" };
                    return Err(ConfigError { message: format!("Can't {verb} to key {k} because its type is not LIST."), key: k.clone() });
                }
                Op::Append(k, v) => {
                    let def = def_of(&k).expect("checked above");
                    let old = out.get(&k).map(String::as_str).unwrap_or(def.default);
                    let mut items: Vec<&str> = list(old);
                    for i in list(&v) {
                        if !items.contains(&i) {
                            items.push(i);
                        }
                    }
                    let joined = items.join(",");
                    out.insert(k, joined);
                }
                Op::Subtract(k, v) => {
                    let def = def_of(&k).expect("checked above");
                    let old = out.get(&k).map(String::as_str).unwrap_or(def.default);
                    let remove = list(&v);
                    let joined = list(old).into_iter().filter(|i| !remove.contains(i)).collect::<Vec<_>>().join(",");
                    out.insert(k, joined);
                }
            }
        }
        Ok(out)
    }
}

impl TopicConfig {
    /// Kafka's defaults, parsed.
    pub fn kafka_default() -> TopicConfig {
        let mut c = TopicConfig::placeholder();
        for def in TOPIC_CONFIGS.iter().filter(|d| d.acted) {
            c.assign(def, def.name, def.default, i32::MAX).expect("the table's defaults parse");
        }
        c
    }

    /// This config with a topic's own configs over it. Every key is
    /// checked against the table; `limit` bounds max.message.bytes.
    pub fn overlay(&self, set: &BTreeMap<String, String>, limit: i32) -> Result<TopicConfig, ConfigError> {
        let mut c = self.clone();
        for (key, value) in set {
            let def = topic_def(key).ok_or_else(|| ConfigError::unknown(key))?;
            check(def, key, value)?;
            c.assign(def, key, value, limit)?;
        }
        c.check_relations()?;
        Ok(c)
    }

    /// [`TopicConfig::overlay`] for configs already stored: a key that no
    /// longer passes is left out and returned instead of refusing the
    /// topic (it must stay usable after an upgrade that added a check), and
    /// a max.message.bytes over `limit` is capped.
    pub fn overlay_stored(&self, set: &BTreeMap<String, String>, limit: i32) -> (TopicConfig, Vec<ConfigError>) {
        let mut c = self.clone();
        let mut skipped = Vec::new();
        for (key, value) in set {
            let applied = topic_def(key).ok_or_else(|| ConfigError::unknown(key)).and_then(|def| check(def, key, value).and_then(|()| c.assign(def, key, value, i32::MAX)));
            if let Err(e) = applied {
                skipped.push(e);
            }
        }
        if c.max_message_bytes > limit {
            skipped.push(ConfigError::invalid("max.message.bytes", &c.max_message_bytes.to_string(), "over what a request may carry; capped"));
            c.max_message_bytes = limit;
        }
        if let Err(e) = c.check_relations() {
            (c.min_compaction_lag_ms, c.max_compaction_lag_ms) = (self.min_compaction_lag_ms, self.max_compaction_lag_ms);
            skipped.push(e);
        }
        (c, skipped)
    }

    /// Sets the field `def` stands for from a checked value (`key` is the
    /// name the value came under, for errors).
    fn assign(&mut self, def: &Def, key: &str, value: &str, limit: i32) -> Result<(), ConfigError> {
        let v = value.trim();
        let long = || v.parse::<i64>().expect("checked");
        match def.name {
            "cleanup.policy" => {
                let items = list(v);
                self.cleanup = super::topics::Cleanup { delete: items.contains(&"delete"), compact: items.contains(&"compact") };
            }
            "compression.type" => self.compression = TopicCompression::parse(v).expect("checked"),
            "delete.retention.ms" => self.delete_retention_ms = long(),
            "max.compaction.lag.ms" => self.max_compaction_lag_ms = long(),
            "max.message.bytes" => {
                let bytes = v.parse::<i32>().expect("checked");
                if bytes > limit {
                    return Err(ConfigError::invalid(key, value, "larger than a request may be (max_request_bytes) or a segment (segment_bytes)"));
                }
                self.max_message_bytes = bytes;
            }
            "message.timestamp.after.max.ms" => self.timestamp_after_max_ms = long(),
            "message.timestamp.before.max.ms" => self.timestamp_before_max_ms = long(),
            "message.timestamp.type" => self.timestamp_type = if v == "LogAppendTime" { TimestampType::LogAppendTime } else { TimestampType::CreateTime },
            "min.cleanable.dirty.ratio" => self.min_cleanable_dirty_ratio = v.parse::<f64>().expect("checked"),
            "min.compaction.lag.ms" => self.min_compaction_lag_ms = long(),
            "min.insync.replicas" => self.min_insync_replicas = v.parse::<i32>().expect("checked"),
            "retention.bytes" => self.retention_bytes = long(),
            "retention.ms" => self.retention_ms = long(),
            _ => debug_assert!(!def.acted, "{} is acted on but not assigned", def.name),
        }
        Ok(())
    }

    /// Checks between keys, as Kafka's LogConfig does.
    fn check_relations(&self) -> Result<(), ConfigError> {
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms {
            return Err(ConfigError {
                key: "min.compaction.lag.ms".into(),
                message: format!(
                    "conflict topic config setting min.compaction.lag.ms ({}) > max.compaction.lag.ms ({})",
                    self.min_compaction_lag_ms, self.max_compaction_lag_ms
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_table_is_consistent() {
        for def in TOPIC_CONFIGS {
            assert!(def.valid.refuse(def.default).is_none(), "{}'s default {} is valid", def.name, def.default);
            assert_eq!(broker_def(def.broker).map(|d| d.name), Some(def.name), "{} has its own broker key", def.name);
            assert!(topic_def(def.name).is_some());
        }
        let d = TopicConfig::kafka_default();
        assert_eq!(d.retention_ms, 604_800_000);
        assert_eq!(d.max_message_bytes, 1_048_588);
        assert!(d.cleanup.delete && !d.cleanup.compact);
        assert_eq!(d.timestamp_after_max_ms, 3_600_000);
        assert_eq!(d.min_cleanable_dirty_ratio, 0.5);
    }

    #[test]
    fn values_are_checked_with_kafkas_words() {
        let d = TopicConfig::kafka_default();
        let e = d.overlay(&map(&[("retention.ms", "abc")]), i32::MAX).unwrap_err();
        assert_eq!(e.message, "Invalid value abc for configuration retention.ms: Not a number of type LONG");
        let e = d.overlay(&map(&[("retention.ms", "-2")]), i32::MAX).unwrap_err();
        assert_eq!(e.message, "Invalid value -2 for configuration retention.ms: Value must be at least -1");
        let e = d.overlay(&map(&[("no.such", "1")]), i32::MAX).unwrap_err();
        assert_eq!(e.message, "Unknown topic config name: no.such");
        assert!(d.overlay(&map(&[("cleanup.policy", "compact,bogus")]), i32::MAX).is_err());
        assert!(d.overlay(&map(&[("cleanup.policy", "")]), i32::MAX).is_err());
        assert!(d.overlay(&map(&[("min.cleanable.dirty.ratio", "1.5")]), i32::MAX).is_err());
        assert!(d.overlay(&map(&[("min.cleanable.dirty.ratio", "NaN")]), i32::MAX).is_err());
        assert!(d.overlay(&map(&[("preallocate", "yes")]), i32::MAX).is_err());
        assert!(d.overlay(&map(&[("max.message.bytes", "2000")]), 1000).is_err(), "bounded by the broker's limit");
        let e = d.overlay(&map(&[("min.compaction.lag.ms", "10"), ("max.compaction.lag.ms", "5")]), i32::MAX).unwrap_err();
        assert!(e.message.starts_with("conflict topic config setting"), "{}", e.message);
        let c = d.overlay(&map(&[("cleanup.policy", "compact, delete"), ("retention.ms", "-1"), ("flush.ms", "10")]), i32::MAX).unwrap();
        assert!(c.cleanup.compact && c.cleanup.delete);
        assert_eq!(c.retention_ms, -1);
    }

    #[test]
    fn stored_configs_that_no_longer_pass_are_skipped_not_fatal() {
        let d = TopicConfig::kafka_default();
        // Kafka 3 allowed a 100 kB segment.bytes; a lag pair set the wrong way.
        let stored = map(&[("segment.bytes", "102400"), ("retention.ms", "5000"), ("max.message.bytes", "9000"), ("min.compaction.lag.ms", "10"), ("max.compaction.lag.ms", "5")]);
        assert!(d.overlay(&stored, 8000).is_err(), "strict for new values");
        let (c, skipped) = d.overlay_stored(&stored, 8000);
        assert_eq!(c.retention_ms, 5000, "the good keys apply");
        assert_eq!(c.max_message_bytes, 8000, "capped");
        assert_eq!((c.min_compaction_lag_ms, c.max_compaction_lag_ms), (d.min_compaction_lag_ms, d.max_compaction_lag_ms));
        let mut keys: Vec<&str> = skipped.iter().map(|e| e.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["max.message.bytes", "min.compaction.lag.ms", "segment.bytes"]);
    }

    #[test]
    fn incremental_edits_follow_kafka() {
        let cur = map(&[("retention.ms", "10")]);
        let def = |k: &str| topic_def(k);
        let out = Alter::Incremental(vec![Op::Append("cleanup.policy".into(), "compact".into()), Op::Delete("retention.ms".into()), Op::Delete("never.set".into())])
            .apply(&cur, def)
            .unwrap();
        assert_eq!(out, map(&[("cleanup.policy", "delete,compact")]), "APPEND starts from the default; DELETE of an unset key is no error");
        let out = Alter::Incremental(vec![Op::Subtract("cleanup.policy".into(), "delete".into())]).apply(&out, def).unwrap();
        assert_eq!(out, map(&[("cleanup.policy", "compact")]));
        let e = Alter::Incremental(vec![Op::Append("retention.ms".into(), "5".into())]).apply(&cur, def).unwrap_err();
        assert_eq!(e.key, "retention.ms");
        let out = Alter::Replace(map(&[("segment.ms", "100")])).apply(&cur, def).unwrap();
        assert_eq!(out, map(&[("segment.ms", "100")]), "AlterConfigs drops what it does not name");
    }

    #[test]
    fn layers_give_values_sources_and_synonyms() {
        let mut layers = BrokerLayers::default();
        layers.statics.insert("log.retention.ms".into(), "1000".into());
        layers.cluster.insert("log.retention.ms".into(), "2000".into());
        layers.cluster.insert("message.max.bytes".into(), "5000".into());
        layers.node.insert("message.max.bytes".into(), "6000".into());
        let (d, skipped) = layers.topic_default(i32::MAX);
        assert!(skipped.is_empty());
        assert_eq!((d.retention_ms, d.max_message_bytes), (2000, 6000));
        let described = layers.describe_topic(&map(&[("retention.ms", "3000")]));
        let r = described.iter().find(|c| c.name == "retention.ms").unwrap();
        assert_eq!((r.value.as_str(), r.source), ("3000", Source::Topic));
        let sources: Vec<Source> = r.synonyms.iter().map(|s| s.2).collect();
        assert_eq!(sources, [Source::Topic, Source::DynamicDefault, Source::Static, Source::Default]);
        let m = described.iter().find(|c| c.name == "max.message.bytes").unwrap();
        assert_eq!((m.value.as_str(), m.source), ("6000", Source::DynamicBroker));
        let cluster = layers.describe_broker(true);
        assert_eq!(cluster.iter().map(|c| (c.name.as_str(), c.value.as_str())).collect::<Vec<_>>(), [("log.retention.ms", "2000"), ("message.max.bytes", "5000")]);
        assert!(cluster.iter().all(|c| c.synonyms.iter().all(|s| s.2 == Source::DynamicDefault)));
        let seg = layers.describe_broker(false).into_iter().find(|c| c.name == "log.segment.bytes").unwrap();
        assert!(seg.read_only);
        // A stored value that no longer passes is left out, not fatal;
        // one over the limit is capped.
        layers.node.insert("log.retention.ms".into(), "soon".into());
        let (d, skipped) = layers.topic_default(5000);
        assert_eq!(skipped.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["log.retention.ms"]);
        assert_eq!((d.retention_ms, d.max_message_bytes), (2000, 5000));
        assert!(check_broker_value("log.retention.ms", "soon", i32::MAX).is_err());
        assert!(check_broker_value("message.max.bytes", "6000", 5000).is_err());
        assert!(check_broker_value("log.retention.ms", "10", 5000).is_ok());
    }
}
