//! The engine: the one API the Kafka listener (and later the REST bridge)
//! calls. It joins the catalog (topics, configs) and storage (branch logs).
//!
//! # Threads and ownership
//!
//! ```text
//!  handlers ──append (bounded queue)──► writer thread ──► Storage::append/flush
//!                                           │ durable acks
//!                                           ▼
//!                                      syncer thread ──► Storage::sync, publish_hw, wake fetches
//! ```
//!
//! The writer thread is the single owner of the write side of storage: it
//! drains every queued append in one round, writes each branch's frames with
//! one positioned write, and hands the round to the syncer. While the syncer
//! runs one fsync, the next round accumulates: that is the group commit
//! (DESIGN.md). Reads run on the caller's thread (the listener calls them on
//! tokio's blocking pool) and take only short read locks.
//!
//! # Flush policy
//!
//! - `always` (default): acks=all is answered after fsync; consumers see
//!   records only once they are durable, so the high watermark never goes
//!   back across a crash (invariant 2).
//! - `interval:<ms>`: fsync every `ms`; acks=all is answered after the write;
//!   a crash of the machine can lose the last interval.
//! - `never`: fsync only when a segment is sealed and on shutdown.

pub mod configs;
mod directory;
mod dynamic;
pub mod pool;
pub mod probe;
pub mod producers;
pub mod subtree;
pub mod topics;
pub mod txns;
mod replica;
pub use replica::HwWait;
mod restore;
pub mod validate;

pub use directory::TopicDirectory;
mod waiters;
mod writer;
pub(crate) use restore::{covered_ends, replace_producer_snapshot, restore_producers, snapshot_producers};
pub(crate) use writer::admit;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::meta::{Catalog, MetaError, TopicRecord};
use crate::protocol::batch::{BatchError, Marker};
use crate::storage::{self, PartitionSpec, ReadError, ReadResult, RetentionPolicy, Storage, StorageConfig, StorageError, Tp};
pub use configs::{Alter, BrokerLayers, BrokerScope, ConfigError, Described, Op, Source};
use dynamic::{stored_config, Defaults};
pub use topics::{Cleanup, TimestampType, TopicConfig, TopicDefaults};
use validate::Rules;
pub use writer::Ack;
use writer::{syncer_loop, AppendFailure, Shared, SyncJob, WriteCmd, Writer};
pub use waiters::Registration;
use waiters::Waiters;

/// Wall-clock milliseconds, injectable for tests.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    Always,
    Interval(Duration),
    Never,
}

impl std::str::FromStr for FlushPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(FlushPolicy::Always),
            "never" => Ok(FlushPolicy::Never),
            _ => s
                .strip_prefix("interval:")
                .and_then(|ms| ms.parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(|ms| FlushPolicy::Interval(Duration::from_millis(ms)))
                .ok_or_else(|| format!("expected always, never or interval:<ms>, got {s:?}")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub storage: StorageConfig,
    pub flush: FlushPolicy,
    pub topic_defaults: TopicDefaults,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    /// Copies of each partition of a topic created without a replication
    /// factor (Kafka's default.replication.factor; cluster mode).
    pub default_replication_factor: i16,
    pub max_partitions_per_topic: i32,
    pub max_topics: usize,
    /// Appends queued for the writer thread before producers wait.
    pub write_queue: usize,
    /// Idempotent-producer state idle this long is forgotten.
    pub producer_id_expiration_ms: i64,
    /// Bound on a compressed batch's inflated size during validation.
    pub max_inflated_batch_bytes: usize,
    /// Threads validating heavy batches (0: one per core).
    pub validation_threads: usize,
    /// Topics one request may create by auto-creation; the rest are put
    /// off (LEADER_NOT_AVAILABLE, retriable).
    pub max_auto_create_per_request: usize,
    /// Topics auto-created per second, broker-wide (0: no limit).
    pub auto_create_per_sec: u32,
    /// Compaction into subtree stores; None: off.
    pub compaction: Option<storage::CompactConfig>,
    /// The compactor reads at most this many bytes per second (0: no limit).
    pub compaction_bytes_per_sec: u64,
    /// How often the server runs the compactor (and then the cleaner).
    pub compaction_interval: std::time::Duration,
    /// Key compaction of `cleanup.policy=compact` topics.
    pub cleaning: storage::CleanConfig,
    /// Where the engine reports fsync times and sizes.
    pub probe: probe::EngineProbe,
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            storage: StorageConfig::default(),
            flush: FlushPolicy::Always,
            topic_defaults: TopicDefaults::default(),
            auto_create_topics: true,
            num_partitions: 1,
            default_replication_factor: 1,
            max_partitions_per_topic: 10_000,
            max_topics: 1_000_000,
            write_queue: 4096,
            producer_id_expiration_ms: 86_400_000,
            max_inflated_batch_bytes: 16 << 20,
            validation_threads: 0,
            max_auto_create_per_request: 100,
            auto_create_per_sec: 100,
            compaction: Some(storage::CompactConfig::default()),
            compaction_bytes_per_sec: 0,
            compaction_interval: std::time::Duration::from_secs(60),
            cleaning: storage::CleanConfig::default(),
            probe: probe::EngineProbe::default(),
        }
    }
}

/// Internal errors, mapped to Kafka error codes in one place
/// (`kafka::errors`).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("topic already exists")]
    TopicExists,
    #[error("invalid topic name: {0}")]
    InvalidTopic(#[from] topics::NameError),
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("{0}")]
    InvalidConfig(#[from] configs::ConfigError),
    /// A broker config change refused (Kafka answers these INVALID_REQUEST).
    #[error("{0}")]
    InvalidBrokerConfig(String),
    #[error("invalid record batch: {0}")]
    Corrupt(#[from] BatchError),
    #[error("batch of {size} bytes exceeds max.message.bytes = {limit}")]
    MessageTooLarge { size: usize, limit: usize },
    #[error("too many topics (limit {0})")]
    TooManyTopics(usize),
    /// Auto-creation refused for now (per-request bound or broker rate):
    /// the client retries.
    #[error("the topic is not created yet (auto-creation is rate limited); retry")]
    AutoCreateDeferred,
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("catalog: {0}")]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// Records of a batch refused one by one (KIP-467); the partition's
    /// batches are not written.
    #[error("{0}")]
    RecordsRefused(validate::RecordErrors),
    /// DeleteRecords to an offset the partition does not have.
    #[error("offset {offset} is outside the partition's range (high watermark {hw})")]
    DeleteOutOfRange { offset: i64, hw: i64 },
    /// Refused by the topic's config (Kafka's POLICY_VIOLATION).
    #[error("{0}")]
    Policy(String),
    /// An idempotent or transactional producer's batch refused.
    #[error("producer batch refused: {0:?}")]
    ProducerRefused(producers::Refusal),
    /// Cluster mode: the cluster's directory (etcd) did not answer or
    /// refused the change; retriable.
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
}

/// A topic in the engine's by-name index, ordered and found by its own
/// name.
#[derive(Debug, Clone)]
struct ByName(Arc<Topic>);

impl std::borrow::Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.record.name
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.record.name == other.0.record.name
    }
}

impl Eq for ByName {}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.record.name.cmp(&other.0.record.name)
    }
}

/// A topic to create (see [`Engine::create_topics`]).
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    pub partitions: i32,
    /// -1: the broker's default (`default_replication_factor`).
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// A topic as the engine knows it.
#[derive(Debug, Clone)]
pub struct Topic {
    pub record: TopicRecord,
    pub config: TopicConfig,
    /// Records and bytes in and out, for metrics.
    pub traffic: Arc<probe::Traffic>,
}

impl Topic {
    pub fn name(&self) -> &str {
        &self.record.name
    }
    pub fn id(&self) -> [u8; 16] {
        self.record.id
    }
    pub fn partitions(&self) -> i32 {
        self.record.partitions
    }
    pub fn tp(&self, partition: i32) -> Tp {
        Tp { topic: self.record.id, partition }
    }
}

/// What an append returns to its producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendResult {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The LogAppendTime given to the batch, or -1 for CreateTime topics.
    pub log_append_time: i64,
    pub log_start: i64,
}

/// A `read_committed` read: the batches below the last stable offset, that
/// offset, and the aborted transactions (producer id, first offset) with
/// records in what is returned.
pub type CommittedRead = (ReadResult, i64, Vec<(i64, i64)>);

/// Topics a request may still auto-create.
#[derive(Debug, Clone, Copy)]
pub struct AutoCreate {
    left: usize,
}

/// An append the writer has queued; resolves when acknowledged.
pub struct PendingAppend {
    rx: oneshot::Receiver<Result<AppendResult, AppendFailure>>,
}

impl PendingAppend {
    pub async fn wait(self) -> Result<AppendResult, EngineError> {
        match self.rx.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(AppendFailure::UnknownPartition)) => Err(EngineError::UnknownTopicOrPartition),
            Ok(Err(AppendFailure::Storage(e))) => Err(EngineError::Storage(StorageError::Poisoned(e))),
            Ok(Err(AppendFailure::Refused(why))) => Err(EngineError::ProducerRefused(why)),
            Ok(Err(AppendFailure::Misplaced(why))) => Err(EngineError::Storage(StorageError::Misplaced(why))),
            Err(_) => Err(EngineError::ShuttingDown),
        }
    }
}

pub struct Engine {
    cfg: EngineConfig,
    catalog: Catalog,
    storage: Arc<Storage>,
    /// Sorted by name: a subtree's topics are one range of it. Keyed by
    /// the name the topic holds (no second copy per topic).
    topics: RwLock<std::collections::BTreeSet<ByName>>,
    /// The same topics by id (frames and retention know topics by id).
    by_id: RwLock<HashMap<[u8; 16], Arc<Topic>>>,
    /// Subtree streams whose ids Metadata gave out, so Fetch v13+ can find
    /// them by id (their ids are hashes of their names; see `subtree`).
    stream_ids: Mutex<HashMap<[u8; 16], String>>,
    /// Moves whenever a topic is created, deleted or gains partitions (so
    /// consumer groups recompute their subscriptions only then).
    topics_version: std::sync::atomic::AtomicU64,
    /// Serialises topic creation, deletion, partition and config changes.
    admin: Mutex<()>,
    /// Serialises what raises log starts (retention, DeleteRecords): each
    /// writes the catalog from the starts it read, so one must not
    /// overwrite the other's higher start with a lower one.
    log_starts: Mutex<()>,
    /// The broker-level config layers and the topic default they give;
    /// replaced (under `admin`) when a broker config changes.
    defaults: RwLock<Arc<Defaults>>,
    writer: mpsc::Sender<WriteCmd>,
    waiters: Arc<Waiters>,
    /// Followers' fetches (cluster mode), woken when a flush writes, not
    /// when it is durable: they read to the log end.
    replica_waiters: Arc<Waiters>,
    cluster_id: String,
    clock: Clock,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Set at shutdown: a running compaction gives up (nothing switched).
    compaction_cancel: std::sync::atomic::AtomicBool,
    producer_stats: Arc<ProducerStats>,
    /// Transactions as the partitions see them (see `txns`); the writer
    /// changes it, fetches read it.
    txns: Arc<RwLock<txns::Txns>>,
    /// Whether any transaction was ever seen: fetches skip the lock until then.
    any_txns: Arc<std::sync::atomic::AtomicBool>,
    /// Threads for CPU-heavy validation, off the async workers.
    cpu: pool::CpuPool,
    /// Auto-creations per second, broker-wide; None: no limit.
    auto_create_rate: Option<crate::limits::TokenBucket>,
    /// Auto-creations refused (per-request bound or rate).
    pub auto_create_refused: std::sync::atomic::AtomicU64,
    /// Cluster mode: where topics are decided (see [`TopicDirectory`]).
    directory: std::sync::OnceLock<Arc<dyn TopicDirectory>>,
}


/// Counters of the idempotent-producer check, kept by the writer.
#[derive(Debug, Default)]
pub struct ProducerStats {
    /// Retried batches answered with their first offsets, not rewritten.
    pub duplicates: std::sync::atomic::AtomicU64,
    /// Batches refused (sequence gap, old epoch, older than the window).
    pub refused: std::sync::atomic::AtomicU64,
}


impl Engine {
    /// Opens the data directory: catalog, then storage recovery.
    pub fn open(cfg: EngineConfig, clock: Clock) -> Result<Arc<Engine>, EngineError> {
        Storage::create_data_dir(&cfg.data_dir, &cfg.storage)?;
        let catalog = Catalog::open(&cfg.data_dir.join("catalog"))?;
        let cluster_id = catalog.cluster_id(|| short_id(&uuid::Uuid::new_v4()))?;
        let clean = Storage::stopped_cleanly(&cfg.data_dir, &cfg.storage);
        // In name order: the catalog keys topics by name.
        let records = catalog.topics()?;
        let log_starts = catalog.log_starts()?;
        let mut specs = Vec::with_capacity(records.len());
        let mut topics = Vec::with_capacity(records.len());
        let layers = BrokerLayers {
            statics: cfg.topic_defaults.statics.clone(),
            cluster: catalog.broker_configs(BrokerScope::Cluster.catalog_key())?,
            node: catalog.broker_configs(BrokerScope::Node.catalog_key())?,
        };
        let limit = cfg.topic_defaults.max_message_bytes_limit;
        let (topic_default, skipped) = layers.topic_default(limit);
        for e in skipped {
            tracing::warn!(key = %e.key, error = %e, "a stored broker config does not apply; left out");
        }
        let defaults = Defaults { topic: topic_default, layers };
        for record in records {
            let config = stored_config(&defaults.topic, &record, limit);
            for p in 0..record.partitions {
                specs.push(PartitionSpec {
                    tp: Tp { topic: record.id, partition: p },
                    branch: storage::branch_of(&record.name).to_owned(),
                    log_start: log_starts.get(&(record.id, p)).copied().unwrap_or(0),
                });
            }
            topics.push(Arc::new(Topic { record, config, traffic: Arc::new(probe::Traffic::new(cfg.probe.traffic.clone())) }));
        }
        let windows = catalog.windows()?;
        let (storage, log_writer) = Storage::open_with(&cfg.data_dir, cfg.storage.clone(), specs, clean, Some(&windows))?;
        let r = storage.recovery_report();
        tracing::info!(clean, segments = r.segments, frames = r.frames, bytes = r.bytes,
            deep_scanned_bytes = r.deep_scanned_bytes, truncated_bytes = r.truncated_bytes,
            elapsed_ms = r.elapsed_ms as u64, topics = topics.len(), "storage recovered");
        storage.clear_clean_marker()?;
        let (producers, txn_state) = restore_producers(&storage, clock(), cfg.producer_id_expiration_ms)?;
        let any_txns = Arc::new(std::sync::atomic::AtomicBool::new(!txn_state.is_empty()));
        let txns = Arc::new(RwLock::new(txn_state));

        let (tx, rx) = mpsc::channel(cfg.write_queue);
        let waiters = Arc::new(Waiters::default());
        let replica_waiters = Arc::new(Waiters::default());
        let producer_stats = Arc::new(ProducerStats::default());
        let (sync_tx, sync_rx) = std::sync::mpsc::sync_channel::<SyncJob>(64);
        let mut threads = Vec::new();
        {
            let setup = writer::Setup {
                clock: clock.clone(),
                waiters: waiters.clone(),
                replica_waiters: replica_waiters.clone(),
                policy: cfg.flush,
                producer_expiry_ms: cfg.producer_id_expiration_ms,
            };
            let shared = Shared { txns: txns.clone(), any_txns: any_txns.clone(), stats: producer_stats.clone() };
            threads.push(
                std::thread::Builder::new()
                    .name("canopy-writer".into())
                    .spawn(move || Writer::new(log_writer, setup, sync_tx, producers, shared).run(rx))
                    .expect("spawn writer thread"),
            );
        }
        {
            let storage = storage.clone();
            let waiters = waiters.clone();
            let policy = cfg.flush;
            let probe = cfg.probe.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("canopy-syncer".into())
                    .spawn(move || syncer_loop(sync_rx, storage, waiters, policy, probe))
                    .expect("spawn syncer thread"),
            );
        }
        let cfg_threads = cfg.validation_threads;
        // Bursts of up to a second's worth, and never below one request's
        // allowance (a client creating its topics at start is not refused).
        let auto_create_rate = (cfg.auto_create_per_sec > 0)
            .then(|| crate::limits::TokenBucket::new(cfg.auto_create_per_sec as f64, (cfg.auto_create_per_sec as f64).max(cfg.max_auto_create_per_request as f64)));
        Ok(Arc::new(Engine {
            cfg,
            catalog,
            storage,
            by_id: RwLock::new({
                let mut by_id = HashMap::with_capacity(topics.len());
                by_id.extend(topics.iter().map(|t| (t.id(), t.clone())));
                by_id
            }),
            stream_ids: Mutex::new(HashMap::new()),
            topics_version: std::sync::atomic::AtomicU64::new(0),
            // Already in name order: the sort only checks it.
            topics: RwLock::new(topics.into_iter().map(ByName).collect()),
            admin: Mutex::new(()),
            log_starts: Mutex::new(()),
            defaults: RwLock::new(Arc::new(defaults)),
            writer: tx,
            waiters,
            replica_waiters,
            cluster_id,
            clock,
            threads: Mutex::new(threads),
            compaction_cancel: std::sync::atomic::AtomicBool::new(false),
            producer_stats,
            txns,
            any_txns,
            cpu: pool::CpuPool::new(cfg_threads),
            auto_create_rate,
            auto_create_refused: Default::default(),
            directory: std::sync::OnceLock::new(),
        }))
    }

    /// The tip's occupancy and hit counters.
    pub fn tip_stats(&self) -> storage::tip::TipStats {
        self.storage.tip_stats()
    }

    /// Counters of the idempotent-producer check.
    pub fn producer_stats(&self) -> &ProducerStats {
        &self.producer_stats
    }

    /// The catalog, for the group coordinator's committed offsets.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
    pub fn now_ms(&self) -> i64 {
        (self.clock)()
    }
    pub fn recovery_report(&self) -> storage::RecoveryReport {
        self.storage.recovery_report().clone()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().expect("topics lock").get(name).map(|t| t.0.clone())
    }

    pub fn topics(&self) -> Vec<Arc<Topic>> {
        self.topics.read().expect("topics lock").iter().map(|t| t.0.clone()).collect()
    }

    /// Moves whenever a topic is created, deleted or gains partitions.
    pub fn topics_version(&self) -> u64 {
        self.topics_version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Calls `f` with every topic name, in name order, under the topics
    /// read lock (no copy of the list).
    pub fn each_topic_name(&self, mut f: impl FnMut(&str)) {
        for t in self.topics.read().expect("topics lock").iter() {
            f(t.0.name());
        }
    }

    pub fn topic_by_id(&self, id: &[u8; 16]) -> Option<Arc<Topic>> {
        self.by_id.read().expect("topics lock").get(id).cloned()
    }

    /// Creates a topic; returns after the catalog is durable. Blocking.
    pub fn create_topic(&self, name: &str, partitions: i32, configs: BTreeMap<String, String>, validate_only: bool) -> Result<Arc<Topic>, EngineError> {
        let new = NewTopic { name: name.to_owned(), partitions, replication_factor: -1, configs };
        self.create_topics(vec![new], validate_only).pop().expect("one answer per topic")
    }

    /// Creates topics together: one answer each, in order; the catalog is
    /// flushed once for all of them (a CreateTopics request naming a
    /// thousand topics costs one fsync, not a thousand). A name given
    /// twice is created once; the second answer is `TopicExists`. Blocking.
    pub fn create_topics(&self, new: Vec<NewTopic>, validate_only: bool) -> Vec<Result<Arc<Topic>, EngineError>> {
        let _admin = self.admin.lock().expect("admin lock");
        let defaults = self.defaults();
        let mut count = self.topics.read().expect("topics lock").len();
        let mut names = std::collections::HashSet::new();
        let mut out: Vec<Result<Arc<Topic>, EngineError>> = new
            .into_iter()
            .map(|t| {
                topics::validate_name(&t.name)?;
                if t.partitions < 1 || t.partitions > self.cfg.max_partitions_per_topic {
                    return Err(EngineError::InvalidPartitions(t.partitions));
                }
                let config = defaults.topic.overlay(&t.configs, self.cfg.topic_defaults.max_message_bytes_limit)?;
                if self.topic(&t.name).is_some() || !names.insert(t.name.clone()) {
                    return Err(EngineError::TopicExists);
                }
                if count >= self.cfg.max_topics {
                    return Err(EngineError::TooManyTopics(self.cfg.max_topics));
                }
                let replication_factor = if t.replication_factor == -1 { self.cfg.default_replication_factor } else { t.replication_factor };
                // Placement checks it against the brokers (cluster mode);
                // one node holds one copy.
                if replication_factor < 1 || (replication_factor > 1 && self.directory.get().is_none()) {
                    return Err(EngineError::InvalidReplicationFactor(format!("replication factor {replication_factor}: this node is a cluster of one")));
                }
                count += 1;
                let record = TopicRecord { id: *uuid::Uuid::new_v4().as_bytes(), name: t.name, partitions: t.partitions, replication_factor, configs: t.configs, created_ms: self.now_ms() };
                Ok(Arc::new(Topic { record, config, traffic: Arc::new(probe::Traffic::new(self.cfg.probe.traffic.clone())) }))
            })
            .collect();
        if validate_only {
            return out;
        }
        if let Some(d) = self.directory.get() {
            for r in out.iter_mut() {
                if let Err(e) = r.as_ref().map(|t| d.create(&t.record)).unwrap_or(Ok(())) {
                    *r = Err(e);
                }
            }
        }
        for r in out.iter_mut() {
            if let Ok(topic) = r {
                if let Err(e) = self.catalog.put_topic(&topic.record) {
                    *r = Err(e.into());
                }
            }
        }
        if let Err(e) = self.catalog.flush() {
            // Nothing is created that the catalog may not remember.
            let why = e.to_string();
            for r in out.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(EngineError::Storage(StorageError::Catalog(why.clone())));
            }
            return out;
        }
        for topic in out.iter().flatten() {
            self.serve_topic(topic.clone());
        }
        out
    }

    /// What one request may auto-create (`max_auto_create_per_request`).
    pub fn auto_create_allowance(&self) -> AutoCreate {
        AutoCreate { left: self.cfg.max_auto_create_per_request }
    }

    /// Returns the topic, creating it with the defaults if auto-creation is
    /// on and both the request's `allowance` and the broker-wide rate
    /// (`auto_create_per_sec`) permit. A creation put off answers
    /// LEADER_NOT_AVAILABLE, which every client retries (as Kafka answered
    /// for a topic it had just begun to create). Blocking when it creates.
    pub fn topic_or_create(&self, name: &str, allowance: &mut AutoCreate) -> Result<Arc<Topic>, EngineError> {
        if let Some(t) = self.topic(name) {
            return Ok(t);
        }
        if !self.cfg.auto_create_topics {
            return Err(EngineError::UnknownTopicOrPartition);
        }
        if allowance.left == 0 || self.auto_create_rate.as_ref().is_some_and(|r| r.take(1, std::time::Instant::now()) == 0) {
            self.auto_create_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(EngineError::AutoCreateDeferred);
        }
        allowance.left -= 1;
        match self.create_topic(name, self.cfg.num_partitions, BTreeMap::new(), false) {
            // Cluster mode: another node created it and this one has not
            // followed yet; retriable, as Kafka answers while a creation
            // is in flight.
            Err(EngineError::TopicExists) if self.directory.get().is_some() => self.topic(name).ok_or(EngineError::AutoCreateDeferred),
            Err(EngineError::TopicExists) => self.topic(name).ok_or(EngineError::UnknownTopicOrPartition),
            other => other,
        }
    }

    /// Deletes a topic. Blocking.
    pub fn delete_topic(&self, name: &str) -> Result<(), EngineError> {
        let _admin = self.admin.lock().expect("admin lock");
        let topic = self.topic(name).ok_or(EngineError::UnknownTopicOrPartition)?;
        if topics::is_internal(name) {
            return Err(EngineError::InvalidTopic(topics::NameError::Reserved(name.to_owned())));
        }
        if let Some(d) = self.directory.get() {
            d.delete(&topic.record)?;
        }
        self.remove_topic(&topic)
    }

    /// Removes a topic from this node (under `admin`).
    fn remove_topic(&self, topic: &Topic) -> Result<(), EngineError> {
        let name = topic.name();
        self.catalog.remove_topic(&topic.record)?;
        // Committed offsets of a deleted topic go with it.
        self.catalog.remove_topic_offsets(name)?;
        self.catalog.flush()?;
        self.topics.write().expect("topics lock").remove(name);
        self.by_id.write().expect("topics lock").remove(&topic.id());
        self.topics_version.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.switch(storage::Switch::remove_topic(topic.id(), topic.partitions()))?;
        self.txns.write().expect("txns lock").remove_topic(&topic.id());
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    /// Raises a topic's partition count. Blocking.
    pub fn create_partitions(&self, name: &str, total: i32, validate_only: bool) -> Result<(), EngineError> {
        let _admin = self.admin.lock().expect("admin lock");
        let topic = self.topic(name).ok_or(EngineError::UnknownTopicOrPartition)?;
        if topics::is_internal(name) {
            return Err(EngineError::InvalidTopic(topics::NameError::Reserved(name.to_owned())));
        }
        if total <= topic.partitions() || total > self.cfg.max_partitions_per_topic {
            return Err(EngineError::InvalidPartitions(total));
        }
        if validate_only {
            return Ok(());
        }
        let mut record = topic.record.clone();
        record.partitions = total;
        if let Some(d) = self.directory.get() {
            d.update(&topic.record, &record)?;
        }
        self.grow_topic(&topic, record)
    }

    /// Gives a topic the partitions `record` has and it lacks (under `admin`).
    fn grow_topic(&self, topic: &Topic, record: TopicRecord) -> Result<(), EngineError> {
        let old = topic.partitions();
        self.catalog.put_topic(&record)?;
        self.catalog.flush()?;
        for p in old..record.partitions {
            self.storage.add_partition(PartitionSpec { tp: topic.tp(p), branch: storage::branch_of(topic.name()).to_owned(), log_start: 0 });
        }
        self.replace_topic(Topic { record, config: topic.config.clone(), traffic: topic.traffic.clone() });
        Ok(())
    }

    /// Makes new topics durable in the catalog, then serves them (under
    /// `admin`); returns how many were added.
    fn add_topics(&self, new: Vec<Arc<Topic>>) -> usize {
        let mut kept = Vec::with_capacity(new.len());
        for t in new {
            match self.catalog.put_topic(&t.record) {
                Ok(()) => kept.push(t),
                Err(e) => tracing::error!(topic = t.name(), error = %e, "recording a topic failed"),
            }
        }
        if let Err(e) = self.catalog.flush() {
            tracing::error!(error = %e, "recording topics failed");
            return 0;
        }
        for topic in &kept {
            self.serve_topic(topic.clone());
        }
        kept.len()
    }

    /// Adds a topic the catalog holds to storage and to the name and id
    /// maps (under `admin`).
    fn serve_topic(&self, topic: Arc<Topic>) {
        let name = topic.name();
        for p in 0..topic.partitions() {
            self.storage.add_partition(PartitionSpec { tp: topic.tp(p), branch: storage::branch_of(name).to_owned(), log_start: 0 });
        }
        self.topics.write().expect("topics lock").insert(ByName(topic.clone()));
        self.by_id.write().expect("topics lock").insert(topic.id(), topic.clone());
        self.topics_version.fetch_add(1, std::sync::atomic::Ordering::Release);
        tracing::info!(topic = name, partitions = topic.partitions(), "topic created");
    }

    /// Puts a changed topic in place of the one of its name and id.
    fn replace_topic(&self, topic: Topic) {
        let topic = Arc::new(topic);
        self.topics.write().expect("topics lock").replace(ByName(topic.clone()));
        self.by_id.write().expect("topics lock").insert(topic.id(), topic);
        self.topics_version.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Validates the batches in `records` (one produce partition's data)
    /// and queues them for the writer. Waits only for queue space; the
    /// returned [`PendingAppend`] resolves when the append is acknowledged
    /// per `ack`. Submitting every partition of a request before waiting on
    /// any lets them share one writer round and one fsync.
    ///
    /// Validation that inflates or recompresses (and any large batch) runs
    /// on the CPU pool, not on the caller's (async) thread.
    pub async fn submit(&self, topic: &Topic, partition: i32, records: Bytes, ack: Ack) -> Result<PendingAppend, EngineError> {
        if partition < 0 || partition >= topic.partitions() {
            return Err(EngineError::UnknownTopicOrPartition);
        }
        let rules = Rules {
            max_message_bytes: topic.config.max_message_bytes as usize,
            // max.message.bytes bounds the batch as sent (compressed, as in
            // Kafka); what it may inflate to is the broker's bound alone.
            max_inflated_bytes: self.cfg.max_inflated_batch_bytes,
            check_timestamps: (topic.config.timestamp_type == TimestampType::CreateTime).then_some((topic.config.timestamp_before_max_ms, topic.config.timestamp_after_max_ms)),
            keys_required: topic.config.cleanup.compact,
            target: match topic.config.compression {
                topics::TopicCompression::Producer => None,
                topics::TopicCompression::Codec(c) => Some(c),
            },
            now: (self.clock)(),
            producer_ids_below: self.catalog.producer_ids_below(),
        };
        let records = if rules.heavy(&records) {
            self.cpu.run(move || rules.validate(records)).await.ok_or(EngineError::ShuttingDown)??
        } else {
            rules.validate(records)?
        };
        let (reply, rx) = oneshot::channel();
        let cmd = WriteCmd::Append(writer::Append {
            tp: topic.tp(partition),
            records,
            log_append_time: topic.config.timestamp_type == TimestampType::LogAppendTime,
            ack,
            traffic: topic.traffic.clone(),
            reply,
        });
        self.writer.send(cmd).await.map_err(|_| EngineError::ShuttingDown)?;
        Ok(PendingAppend { rx })
    }

    /// Appends a follower's copy of its leader's batches for one partition
    /// (cluster mode): they keep the leader's offsets and bytes, and are
    /// checked for shape and CRC only — the leader applied the produce
    /// rules. Producer and transaction state follow them, so this replica
    /// answers retries and fences zombies as its leader did. A batch below
    /// the partition's log end is refused (`StorageError::Misplaced`), and
    /// so is a copy whose batches are not in offset order or cannot be
    /// placed at all: all of it, before anything is appended.
    pub async fn replicate(&self, tp: Tp, records: Bytes, ack: Ack) -> Result<PendingAppend, EngineError> {
        let mut next = 0;
        for b in crate::protocol::batch::split(&records) {
            let b = b?;
            if b.len() > self.cfg.max_inflated_batch_bytes {
                return Err(BatchError::TooLarge { size: b.len(), limit: self.cfg.max_inflated_batch_bytes }.into());
            }
            let h = crate::protocol::batch::check_shape(b)?;
            storage::placeable(h.base_offset, h.last_offset_delta)?;
            if h.base_offset < next {
                return Err(StorageError::Misplaced(format!("a copy's batch at offset {} follows one ending at {}", h.base_offset, next - 1)).into());
            }
            next = h.last_offset() + 1;
        }
        if records.is_empty() {
            return Err(BatchError::Truncated { present: 0, needed: crate::protocol::batch::HEADER_BYTES }.into());
        }
        let (reply, rx) = oneshot::channel();
        self.writer.send(WriteCmd::Replicate(writer::Replicate { tp, records, ack, reply })).await.map_err(|_| EngineError::ShuttingDown)?;
        Ok(PendingAppend { rx })
    }

    /// Runs CPU-heavy request work (inflating a REST body) on the CPU pool;
    /// `None` once the broker is stopping.
    pub async fn run_cpu<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        self.cpu.run(f).await
    }

    /// (threads, jobs queued or running) of the CPU pool.
    pub fn cpu_stats(&self) -> (usize, usize) {
        (self.cpu.threads(), self.cpu.pending())
    }

    /// [`Engine::submit`] and wait.
    pub async fn append(&self, topic: &Topic, partition: i32, records: Bytes, ack: Ack) -> Result<AppendResult, EngineError> {
        self.submit(topic, partition, records, ack).await?.wait().await
    }

    /// Reads batches of a tp from `offset`, up to the high watermark. Does
    /// file I/O: call it off the async runtime.
    pub fn read(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool) -> Result<ReadResult, EngineError> {
        Ok(self.storage.read(tp, offset, max_bytes, min_one)?)
    }

    /// Reads ahead for a consumer streaming `tp` (see `storage::log`).
    /// Does file I/O.
    pub fn read_ahead(&self, tp: &Tp, offset: i64, max_bytes: usize) {
        self.storage.read_ahead(tp, offset, max_bytes)
    }

    /// (log start, high watermark, log end) of a tp.
    pub fn offsets(&self, tp: &Tp) -> Option<(i64, i64, i64)> {
        self.storage.offsets(tp)
    }

    /// Every partition's (log start, high watermark, log end), in one walk
    /// (for metrics: a million lookups cost far more).
    pub fn visit_offsets(&self, f: impl FnMut(&Tp, i64, i64, i64)) {
        self.storage.visit_offsets(f)
    }

    /// ListOffsets by timestamp. Does file I/O.
    pub fn offset_for_timestamp(&self, tp: &Tp, ts: i64) -> Result<Option<(i64, i64)>, EngineError> {
        Ok(self.storage.offset_for_timestamp(tp, ts)?)
    }

    /// The first record with the tp's largest timestamp, with that
    /// timestamp (ListOffsets -3); None when the tp is empty.
    pub fn offset_of_max_timestamp(&self, tp: &Tp) -> Result<Option<(i64, i64)>, EngineError> {
        Ok(self.storage.offset_of_max_timestamp(tp)?)
    }

    /// Reads for a `read_committed` consumer: only below the last stable
    /// offset, with the aborted transactions that have records in what is
    /// returned. Does file I/O.
    pub fn read_committed(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool) -> Result<CommittedRead, EngineError> {
        let (log_start, hw, leo) = self.offsets(tp).ok_or(EngineError::UnknownTopicOrPartition)?;
        let lso = self.last_stable_offset(tp, hw);
        if offset >= lso {
            // Nothing stable to give (yet), as `read` would answer it.
            if offset < log_start || offset > leo {
                return Err(ReadError::OffsetOutOfRange { offset, log_start, end: leo }.into());
            }
            let r = ReadResult { records: Vec::new(), high_watermark: hw, log_start, log_end: leo, bytes_scanned: 0, next_offset: offset, from_tip: false };
            return Ok((r, lso, Vec::new()));
        }
        let mut r = self.storage.read(tp, offset, max_bytes, min_one)?;
        // Frames hold one batch each, so the cut falls between batches.
        if let Some(cut) = r.records.iter().position(|b| b.len() >= 8 && i64::from_be_bytes(b[..8].try_into().expect("8 bytes")) >= lso) {
            r.next_offset = i64::from_be_bytes(r.records[cut][..8].try_into().expect("8 bytes"));
            r.records.truncate(cut);
        }
        let aborted = if self.any_txns.load(std::sync::atomic::Ordering::Acquire) {
            self.txns.read().expect("txns lock").aborted_in(tp, offset, r.next_offset)
        } else {
            Vec::new()
        };
        Ok((r, lso, aborted))
    }

    /// The last stable offset of `tp` given its high watermark `hw`: the
    /// first offset of its oldest open transaction, else `hw`.
    pub fn last_stable_offset(&self, tp: &Tp, hw: i64) -> i64 {
        if !self.any_txns.load(std::sync::atomic::Ordering::Acquire) {
            return hw;
        }
        self.txns.read().expect("txns lock").first_unstable(tp).map_or(hw, |f| f.min(hw))
    }

    /// Lets the transaction of `producer_id` at `epoch` write to `tps`
    /// (the coordinator calls it before answering AddPartitionsToTxn).
    pub fn add_txn_partitions(&self, producer_id: i64, epoch: i16, tps: &[Tp]) {
        self.any_txns.store(true, std::sync::atomic::Ordering::Release);
        let mut t = self.txns.write().expect("txns lock");
        for tp in tps {
            t.add_partition(producer_id, epoch, *tp);
        }
    }

    /// A verification guard for `producer_id`'s batches to `tp`, taken
    /// before the transaction's coordinator (another node) is asked
    /// (`txns::Txns::begin_verification`).
    pub fn begin_txn_verification(&self, producer_id: i64, tp: Tp) -> u64 {
        let now = self.now_ms();
        self.txns.write().expect("txns lock").begin_verification(producer_id, tp, now)
    }

    /// The coordinator let `tp` into (`producer_id`, `epoch`)'s
    /// transaction: added unless a marker for the producer reached `tp`
    /// since `guard` was taken (false then).
    pub fn add_verified_txn_partition(&self, producer_id: i64, epoch: i16, tp: Tp, guard: u64) -> bool {
        self.any_txns.store(true, std::sync::atomic::Ordering::Release);
        self.txns.write().expect("txns lock").add_verified(producer_id, epoch, tp, guard)
    }

    /// Gives a verification guard back unused.
    pub fn release_txn_verification(&self, producer_id: i64, tp: Tp, guard: u64) {
        self.txns.write().expect("txns lock").release_verification(producer_id, tp, guard);
    }

    /// Whether the transaction of `producer_id` at `epoch` has added `tp`
    /// (and not ended since).
    pub fn txn_admits(&self, producer_id: i64, epoch: i16, tp: &Tp) -> bool {
        self.any_txns.load(std::sync::atomic::Ordering::Acquire) && self.txns.read().expect("txns lock").admits(producer_id, epoch, tp)
    }

    /// Writes `marker` for `producer_id` at `epoch` to every tp in `tps`
    /// and returns once they are all durable. Partitions deleted meanwhile
    /// are skipped.
    pub async fn write_markers(&self, producer_id: i64, epoch: i16, marker: Marker, tps: &[Tp]) -> Result<(), EngineError> {
        for p in self.queue_markers(producer_id, epoch, 0, marker, tps, false).await? {
            match p.wait().await {
                Ok(_) | Err(EngineError::UnknownTopicOrPartition) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// WriteTxnMarkers: writes `marker` for `producer_id` at `epoch`, from
    /// a coordinator of `coordinator_epoch`, to each of `tps`, each
    /// answered on its own once durable: refused (INVALID_PRODUCER_EPOCH)
    /// where the producer has a newer epoch already, or
    /// (TRANSACTION_COORDINATOR_FENCED) a marker of a newer coordinator,
    /// UNKNOWN_TOPIC_OR_PARTITION where the tp went meanwhile.
    pub async fn write_markers_checked(&self, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, tps: &[Tp]) -> Vec<Result<AppendResult, EngineError>> {
        let Ok(pending) = self.queue_markers(producer_id, epoch, coordinator_epoch, marker, tps, true).await else { return tps.iter().map(|_| Err(EngineError::ShuttingDown)).collect() };
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(p.wait().await);
        }
        out
    }

    /// Hands the writer a marker for each of `tps` (all in one go, so they
    /// share its rounds); `checked`: see `WriteCmd::Marker`.
    async fn queue_markers(&self, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, tps: &[Tp], checked: bool) -> Result<Vec<PendingAppend>, EngineError> {
        let mut pending = Vec::with_capacity(tps.len());
        for tp in tps {
            let (reply, rx) = oneshot::channel();
            self.writer.send(WriteCmd::Marker { tp: *tp, producer_id, epoch, coordinator_epoch, marker, checked, reply }).await.map_err(|_| EngineError::ShuttingDown)?;
            pending.push(PendingAppend { rx });
        }
        Ok(pending)
    }

    /// Stops admitting the transaction's batches to `tps` and returns each
    /// tp's log end after every batch admitted before (-1: gone).
    pub async fn close_txn_partitions(&self, producer_id: i64, tps: Vec<Tp>) -> Result<Vec<i64>, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.writer.send(WriteCmd::CloseTxn { producer_id, tps, reply }).await.map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)
    }

    /// The producers with state in each of `tps`, in order
    /// (DescribeProducers), asked of the writer that owns that state.
    pub async fn describe_producers(&self, tps: Vec<Tp>) -> Result<Vec<Vec<producers::ActiveProducer>>, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.writer.send(WriteCmd::DescribeProducers { tps, reply }).await.map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)
    }

    /// Transactions with data in a partition and no marker yet.
    pub fn open_txns(&self) -> Vec<(Tp, txns::OpenTxn)> {
        self.txns.read().expect("txns lock").ongoing()
    }

    /// Registers `notify` to be woken when any of `tps` (distinct) gets new
    /// data, or any tp at all with `any_tp`; until the registration drops.
    pub fn subscribe(&self, tps: Vec<Tp>, any_tp: bool, notify: &Arc<Notify>) -> Registration {
        self.waiters.register(tps, any_tp, notify)
    }

    /// (long-poll fetches waiting, tps they wait on).
    pub fn waiter_stats(&self) -> (usize, usize) {
        self.waiters.stats()
    }

    fn retention_policy(&self) -> impl Fn(&Tp) -> RetentionPolicy + '_ {
        move |tp: &Tp| {
            self.topic_by_id(&tp.topic)
                // A compact-only topic keeps old data: its records go by key.
                .filter(|t| t.config.cleanup.delete)
                .map(|t| RetentionPolicy {
                    retention_ms: (t.config.retention_ms >= 0).then_some(t.config.retention_ms),
                    retention_bytes: (t.config.retention_bytes >= 0).then_some(t.config.retention_bytes as u64),
                })
                .unwrap_or_default()
        }
    }

    /// Applies retention: raises log start offsets (persisted before any
    /// file goes) and deletes dead segments. Blocking; the server schedules
    /// it every `retention_check_interval_ms`. It touches only sealed
    /// segments, never the writer's active one.
    pub fn enforce_retention(&self) -> Result<usize, EngineError> {
        let _starts = self.log_starts.lock().expect("log starts lock");
        let policy = self.retention_policy();
        let (starts, deleted) = self.storage.enforce_retention(
            self.now_ms(),
            policy,
            |starts| {
                let rows: Vec<_> = starts.iter().map(|(tp, s)| (tp.topic, tp.partition, *s)).collect();
                self.catalog.put_log_starts(&rows).map_err(|e| e.to_string())
            },
            |stores| self.catalog.drop_stores(stores).map_err(|e| e.to_string()),
            &mut |sw| self.switch(sw),
        )?;
        self.trim_txns(&starts);
        Ok(deleted)
    }

    /// Runs one compaction window if a sealed segment is due (see
    /// `storage::log::compact`). Blocking; the server schedules it every
    /// `compaction_interval`. The window record is durable in the catalog
    /// before any reader moves to the stores.
    pub fn compact(&self) -> Result<Option<storage::Compacted>, EngineError> {
        let Some(cfg) = self.cfg.compaction.clone() else { return Ok(None) };
        self.compact_with(&cfg)
    }

    /// [`Engine::compact`] with a given configuration (tests, benchmarks).
    pub fn compact_with(&self, cfg: &storage::CompactConfig) -> Result<Option<storage::Compacted>, EngineError> {
        if self.compaction_cancel.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(None);
        }
        let mut throttle = self.maintenance_throttle();
        // Keyed topics get stores of their own, for the cleaner.
        let name_of = |id: &[u8; 16]| self.topic_by_id(id).map(|t| storage::TopicView { name: t.record.name.clone(), keyed: t.config.cleanup.compact });
        match self.storage.compact(self.now_ms(), cfg, name_of, &mut throttle, |w| self.catalog.put_window(w).map_err(|e| e.to_string()), &mut |sw| self.switch(sw)) {
            // Cancelled by shutdown: nothing was switched.
            Err(StorageError::Stopped(_)) if self.compaction_cancel.load(std::sync::atomic::Ordering::Acquire) => Ok(None),
            r => Ok(r?),
        }
    }

    /// Cleans one keyed topic (`cleanup.policy` with `compact`) if one is
    /// due (see `storage::log::clean`): its stores keep the latest record
    /// per key. Blocking; the server runs it after each compaction round.
    /// The cleaning's window is durable in the catalog before any reader
    /// moves to its store.
    pub fn clean(&self) -> Result<Option<storage::Cleaned>, EngineError> {
        if self.cfg.compaction.is_none() || self.compaction_cancel.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(None);
        }
        let mut throttle = self.maintenance_throttle();
        let policy = |id: &[u8; 16]| {
            let t = self.topic_by_id(id).filter(|t| t.config.cleanup.compact)?;
            let c = &t.config;
            Some(storage::CleanPolicy {
                delete_retention_ms: c.delete_retention_ms,
                min_compaction_lag_ms: c.min_compaction_lag_ms,
                max_compaction_lag_ms: c.max_compaction_lag_ms,
                min_cleanable_dirty_ratio: c.min_cleanable_dirty_ratio,
                delete: c.cleanup.delete,
            })
        };
        match self.storage.clean(self.now_ms(), &self.cfg.cleaning, policy, &mut throttle, |w| self.catalog.put_window(w).map_err(|e| e.to_string()), &mut |sw| self.switch(sw)) {
            Err(StorageError::Stopped(_)) if self.compaction_cancel.load(std::sync::atomic::Ordering::Acquire) => Ok(None),
            r => Ok(r?),
        }
    }

    /// The throttle of maintenance's reads (compaction and cleaning): it
    /// sleeps to hold `compaction_bytes_per_sec`, and answers false once
    /// shutdown cancelled maintenance.
    fn maintenance_throttle(&self) -> impl FnMut(u64) -> bool + '_ {
        let rate = self.cfg.compaction_bytes_per_sec;
        let started = std::time::Instant::now();
        let mut read = 0u64;
        let stopping = &self.compaction_cancel;
        move |bytes: u64| {
            read += bytes;
            if rate > 0 {
                let due = std::time::Duration::from_secs_f64(read as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    // In short steps, so shutdown is not held up.
                    let until = std::time::Instant::now() + wait;
                    while !stopping.load(std::sync::atomic::Ordering::Acquire) && std::time::Instant::now() < until {
                        std::thread::sleep((until - std::time::Instant::now()).min(std::time::Duration::from_millis(50)));
                    }
                }
            }
            !stopping.load(std::sync::atomic::Ordering::Acquire)
        }
    }

    /// Hands a switch maintenance prepared to the writer thread and waits
    /// until it is applied (the writer alone changes the log's structure;
    /// see `storage::log::switch`). Blocking: from the maintenance
    /// threads, never from async code.
    fn switch(&self, sw: storage::Switch) -> Result<(), StorageError> {
        let (reply, rx) = oneshot::channel();
        let gone = || StorageError::Stopped("the writer thread has stopped".into());
        self.writer.blocking_send(WriteCmd::Switch { switch: sw, reply }).map_err(|_| gone())?;
        rx.blocking_recv().map_err(|_| gone())?
    }

    /// Makes a running compaction give up at its next MiB (nothing is
    /// switched) and later ones return at once: the first step of shutdown.
    pub fn cancel_compaction(&self) {
        self.compaction_cancel.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Compaction windows the catalog records (split plans included).
    pub fn compaction_windows(&self) -> Result<Vec<storage::subtree::WindowRecord>, EngineError> {
        Ok(self.catalog.windows()?)
    }

    /// Why writes are refused for good (storage poisoned by a failed
    /// write or fsync, or a panic on the write path), if they are.
    pub fn poisoned(&self) -> Option<String> {
        self.storage.poison_reason()
    }

    /// Storage, for counters.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Stops the writer after it drains, syncs everything, and marks the
    /// shutdown clean. Idempotent.
    pub async fn shutdown(&self) {
        self.compaction_cancel.store(true, std::sync::atomic::Ordering::Release);
        let (tx, rx) = oneshot::channel();
        if self.writer.send(WriteCmd::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        for t in threads {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        // The last hws of replicated tps (`storage::log::hws`): a clean
        // restart exposes what this node could.
        let storage = self.storage.clone();
        let hws = tokio::task::spawn_blocking(move || storage.checkpoint_hws()).await;
        if let Ok(Err(e)) = &hws {
            tracing::warn!(error = %e, "writing the high-watermark checkpoint at shutdown failed");
        }
        let clean = self.storage.sync().is_ok() && self.catalog.flush().is_ok() && self.storage.mark_clean().is_ok();
        tracing::info!(clean, "engine stopped");
    }
}

/// A cluster id as Kafka writes them: a UUID in 22 characters of
/// URL-safe base64.
pub fn short_id(u: &uuid::Uuid) -> String {
    // Kafka cluster ids are 22-character URL-safe base64 UUIDs.
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = u.as_u128();
    let mut s = String::with_capacity(22);
    for _ in 0..22 {
        s.push(ALPHABET[(bits & 63) as usize] as char);
        bits >>= 6;
    }
    s
}

#[cfg(test)]
mod tests;
