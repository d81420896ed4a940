//! The scrape: the probes' histograms (registered), then families built
//! from counters and state as they are at this moment. Every name is
//! `canopy_*` with its unit; `process_*` are Prometheus's standard process
//! metrics.
//!
//! Per-topic series are bounded: with at most `topic_label_limit` topics
//! each topic is its own label; past that, topics are summed per branch
//! (`topic="app.codestore.*"`, `partition="*"`), and branches per
//! shorter prefix until the labels fit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::engine::probe::EngineProbe;
use crate::engine::Engine;
use crate::kafka::probe::KafkaProbe;
use crate::kafka::replication::Replication;
use crate::rest::Bridge;

use super::Health;
use crate::probe::ConnectionStats;

pub struct Metrics {
    registry: Registry,
    engine: Arc<Engine>,
    kafka: Arc<KafkaProbe>,
    rest: Option<Arc<Bridge>>,
    health: Arc<Health>,
    limits: Limits,
    topic_label_limit: usize,
    /// Cluster mode's replication (None on a single node).
    replication: Option<Arc<Replication>>,
}

/// The broker's limits and what uses them, for "how close to the limit"
/// gauges (every limit has one).
pub struct Limits {
    pub budget: Arc<crate::limits::MemoryBudget>,
    pub per_ip: Arc<crate::limits::PerIp>,
    pub max_connections: usize,
    pub max_topics: usize,
    pub fetch_sessions: Arc<crate::kafka::fetch_session::FetchSessions>,
    pub fetch_session_slots: usize,
    pub fetch_session_partitions: usize,
}

impl Metrics {
    pub fn new(engine: Arc<Engine>, engine_probe: &EngineProbe, kafka: Arc<KafkaProbe>, rest: Option<Arc<Bridge>>, health: Arc<Health>, limits: Limits, topic_label_limit: usize) -> Metrics {
        let registry = Registry::new();
        let register = |c: Box<dyn prometheus::core::Collector>| registry.register(c).expect("metric names are unique");
        register(Box::new(engine_probe.sync_seconds.clone()));
        register(Box::new(engine_probe.sync_bytes.clone()));
        for s in kafka.slots() {
            register(Box::new(s.latency.clone()));
        }
        if let Some(b) = &rest {
            for h in &b.probe.latency {
                register(Box::new(h.clone()));
            }
        }
        #[cfg(target_os = "linux")]
        register(Box::new(prometheus::process_collector::ProcessCollector::for_self()));
        Metrics { registry, engine, kafka, rest, health, limits, topic_label_limit: topic_label_limit.max(1), replication: None }
    }

    /// Adds cluster mode's replication families.
    pub fn with_replication(mut self, replication: Arc<Replication>) -> Metrics {
        self.replication = Some(replication);
        self
    }

    /// Why the broker refuses writes, if it does (`/ready` answers 503).
    pub fn poisoned(&self) -> Option<String> {
        self.engine.poisoned()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut f = Families::default();
        self.broker(&mut f);
        self.kafka(&mut f);
        self.limits(&mut f);
        self.rest(&mut f);
        self.partitions(&mut f);
        self.storage(&mut f);
        self.replication(&mut f);
        encode(self.registry.gather(), f)
    }

    fn broker(&self, f: &mut Families) {
        identity(f, &self.health);
        // One series: 1 with the reason once writes are refused for good.
        let poisoned = self.engine.poisoned();
        f.gauge(
            "canopy_storage_poisoned",
            "1 once storage refuses every write (a failed write or fsync, a panic on the write path), with the reason; restart after checking the disk",
            &[("reason", poisoned.clone().unwrap_or_default())],
            poisoned.is_some() as u8 as f64,
        );
        let p = self.engine.producer_stats();
        f.counter("canopy_producer_duplicates_total", "Retried idempotent batches answered with their first offsets, not rewritten", &[], p.duplicates.load(Ordering::Relaxed) as f64);
        f.counter("canopy_producer_refused_total", "Idempotent batches refused (sequence gap, old epoch)", &[], p.refused.load(Ordering::Relaxed) as f64);
    }

    /// Cluster mode: Kafka's replica manager and fetcher metrics, under
    /// Kafka's names (absent on a single node, which replicates nothing).
    fn replication(&self, f: &mut Families) {
        let Some(r) = &self.replication else { return };
        let s = &r.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        f.gauge("canopy_leader_partitions", "Partitions this node leads (Kafka's LeaderCount)", &[], get(&s.leader_partitions));
        f.gauge("canopy_under_replicated_partitions", "Partitions this node leads whose ISR is smaller than their replica set (Kafka's UnderReplicatedPartitions)", &[], get(&s.under_replicated));
        f.gauge("canopy_under_min_isr_partitions", "Partitions this node leads whose ISR is smaller than min.insync.replicas: acks=all is refused there (Kafka's UnderMinIsrPartitionCount)", &[], get(&s.under_min_isr));
        f.gauge("canopy_offline_partitions", "Partitions without a live leader, counted by the controller (0 on other nodes; Kafka's OfflinePartitionsCount)", &[], get(&s.offline));
        f.counter("canopy_isr_shrinks_total", "Partitions whose ISR this node, as their leader, shrank (Kafka's IsrShrinksPerSec)", &[], get(&s.isr_shrinks));
        f.counter("canopy_isr_expands_total", "Partitions whose ISR this node, as their leader, expanded (Kafka's IsrExpandsPerSec)", &[], get(&s.isr_expands));
        f.counter("canopy_leader_elections_total", "Partitions this node began leading in a new leader epoch; summed over the nodes, the cluster's leader elections", &[], get(&s.leader_epochs));
        f.gauge("canopy_replica_max_lag_records", "The most records any partition this node follows is behind its leader's high watermark (Kafka's replica fetcher MaxLag)", &[], get(&s.max_lag));
    }

    fn kafka(&self, f: &mut Families) {
        connections(f, "kafka", &self.kafka.connections);
        for s in self.kafka.slots() {
            let api = format!("{:?}", s.key);
            // Every served API and version from the start, zeros included.
            for (i, c) in s.requests.iter().enumerate() {
                let version = (s.min_version + i as i16).to_string();
                f.counter("canopy_kafka_requests_total", "Kafka requests answered, by API and version", &[("api", api.clone()), ("version", version)], c.load(Ordering::Relaxed) as f64);
            }
            for (code, n) in s.error_counts() {
                f.counter("canopy_kafka_errors_total", "Kafka error codes answered (per partition where the API has partitions), by API and error", &[("api", api.clone()), ("error", error_name(code))], n as f64);
            }
        }
        // The same by error alone, every code Kafka defines from the start,
        // so an alert on a code sees its series before the first one.
        let mut by_code: BTreeMap<i16, u64> = (-1..crate::kafka::probe::ERROR_CODES as i16 - 1).filter(|c| kafka_protocol::ResponseError::try_from_code(*c).is_some()).map(|c| (c, 0)).collect();
        for s in self.kafka.slots() {
            for (code, n) in s.error_counts() {
                *by_code.entry(code).or_default() += n;
            }
        }
        for (code, n) in by_code {
            f.counter("canopy_kafka_error_codes_total", "Kafka error codes answered, all APIs together, by error (every code exported from start)", &[("error", error_name(code))], n as f64);
        }
        for (reason, n) in self.kafka.closed_counts() {
            f.counter("canopy_kafka_connections_closed_total", "Kafka connections ended, by reason (client: the client closed it)", &[("reason", reason.to_owned())], n as f64);
        }
        for (rt, n) in self.kafka.denied_counts() {
            f.counter("canopy_kafka_authorization_denied_total", "Kafka requests (or parts of them) the authorizer refused, by resource type", &[("resource_type", rt.to_owned())], n as f64);
        }
        for (quota, n, secs) in self.kafka.throttle_counts() {
            f.counter("canopy_kafka_throttles_total", "Kafka responses a client quota throttled, by quota (producer_byte_rate, consumer_byte_rate, request_percentage)", &[("quota", quota.to_owned())], n as f64);
            f.counter("canopy_kafka_throttle_seconds_total", "Throttle time client quotas asked of Kafka clients, by quota", &[("quota", quota.to_owned())], secs);
        }
        for ((listener, mechanism, outcome), n) in self.kafka.auth_counts() {
            f.counter(
                "canopy_kafka_authentications_total",
                "SASL authentications on the Kafka listeners, by listener, mechanism and outcome (success, failure, reauthentication)",
                &[("listener", listener), ("mechanism", mechanism.to_owned()), ("outcome", outcome.to_owned())],
                n as f64,
            );
        }
    }

    /// Each limit with what uses it now.
    fn limits(&self, f: &mut Families) {
        let l = &self.limits;
        let b = &l.budget;
        f.gauge("canopy_request_budget_bytes", "Request bytes held in memory by the Kafka and REST listeners (queued_max_request_bytes), by state", &[("state", "used".into())], b.in_use() as f64);
        f.gauge("canopy_request_budget_bytes", "Request bytes held in memory by the Kafka and REST listeners (queued_max_request_bytes), by state", &[("state", "limit".into())], b.total() as f64);
        f.gauge("canopy_request_budget_waiting_connections", "Kafka connections not read because their next request does not fit the budget", &[], b.waiting() as f64);
        f.counter("canopy_request_budget_waits_total", "Times a Kafka connection waited for the request budget", &[], b.waits.load(Ordering::Relaxed) as f64);
        f.counter("canopy_request_budget_refusals_total", "REST requests refused (503) because the request budget was spent", &[], b.refusals.load(Ordering::Relaxed) as f64);
        f.gauge("canopy_connections_limit", "Most open client connections, by listener", &[("listener", "kafka".into())], l.max_connections as f64);
        f.gauge("canopy_connections_per_ip_busiest", "Open Kafka connections of the address with the most", &[], l.per_ip.busiest() as f64);
        f.gauge("canopy_connections_per_ip_limit", "Most open Kafka connections from one address (max_connections_per_ip)", &[], l.per_ip.max() as f64);
        f.gauge("canopy_topics_limit", "Most topics (max_topics)", &[], l.max_topics as f64);
        f.counter("canopy_auto_create_refused_total", "Topics not auto-created: past max_auto_create_per_request or auto_create_topics_per_sec", &[], self.engine.auto_create_refused.load(Ordering::Relaxed) as f64);
        let (sessions, cached) = l.fetch_sessions.stats();
        f.gauge("canopy_fetch_sessions", "Fetch sessions (KIP-227) in the cache, and its limit (max_incremental_fetch_session_cache_slots), by state", &[("state", "used".into())], sessions as f64);
        f.gauge("canopy_fetch_sessions", "Fetch sessions (KIP-227) in the cache, and its limit (max_incremental_fetch_session_cache_slots), by state", &[("state", "limit".into())], l.fetch_session_slots as f64);
        f.gauge("canopy_fetch_session_partitions", "Partitions held by all fetch sessions, and their limit (max_incremental_fetch_session_cache_partitions), by state", &[("state", "used".into())], cached as f64);
        f.gauge("canopy_fetch_session_partitions", "Partitions held by all fetch sessions, and their limit (max_incremental_fetch_session_cache_partitions), by state", &[("state", "limit".into())], l.fetch_session_partitions as f64);
        f.counter("canopy_fetch_session_evictions_total", "Fetch sessions evicted to make room for another", &[], l.fetch_sessions.evictions.load(Ordering::Relaxed) as f64);
        f.counter("canopy_fetch_incremental_total", "Fetches answered incrementally through a fetch session", &[], l.fetch_sessions.incremental.load(Ordering::Relaxed) as f64);
        let (fetches, tps) = self.engine.waiter_stats();
        f.gauge("canopy_fetch_waiters", "Long-poll fetches waiting, and the partitions they wait on, by kind", &[("kind", "fetches".into())], fetches as f64);
        f.gauge("canopy_fetch_waiters", "Long-poll fetches waiting, and the partitions they wait on, by kind", &[("kind", "partitions".into())], tps as f64);
        let files = self.engine.storage().file_cache();
        f.gauge("canopy_open_files", "Segment and store files held open by the descriptor cache, and its limit (max_open_files), by state", &[("state", "open".into())], files.open_files() as f64);
        f.gauge("canopy_open_files", "Segment and store files held open by the descriptor cache, and its limit (max_open_files), by state", &[("state", "limit".into())], files.capacity() as f64);
        f.counter("canopy_file_reopens_total", "Files opened again after the descriptor cache had closed them", &[], files.reopens.load(Ordering::Relaxed) as f64);
        f.gauge("canopy_descriptor_limit", "The process's soft limit on open descriptors (raised to the hard limit at start)", &[], crate::storage::files::nofile_limit() as f64);
        let (threads, pending) = self.engine.cpu_stats();
        f.gauge("canopy_validation_pool_threads", "Threads inflating and checking heavy batches and REST bodies (validation_threads)", &[], threads as f64);
        f.gauge("canopy_validation_pool_jobs", "Validation jobs queued or running", &[], pending as f64);
    }

    fn rest(&self, f: &mut Families) {
        let Some(b) = &self.rest else { return };
        connections(f, "rest", &b.connections);
        // Every reason from the start, zeros included.
        let mut rejected: BTreeMap<&str, u64> = ["unauthenticated", "forbidden", "too_large", "rate_limited", "unavailable"].into_iter().map(|r| (r, 0)).collect();
        for (route, status, n) in b.probe.counts() {
            let reason = match status.as_str() {
                "401" => Some("unauthenticated"),
                "403" => Some("forbidden"),
                "413" => Some("too_large"),
                "429" => Some("rate_limited"),
                "503" => Some("unavailable"),
                _ => None,
            };
            if let Some(r) = reason {
                *rejected.entry(r).or_default() += n;
            }
            f.counter("canopy_rest_requests_total", "REST requests answered, by route and status", &[("route", route.to_owned()), ("status", status)], n as f64);
        }
        for (reason, n) in rejected {
            f.counter("canopy_rest_rejected_total", "REST requests refused (401, 403, 413, 429, 503), by reason", &[("reason", reason.to_owned())], n as f64);
        }
        f.counter("canopy_rest_events_total", "Records and events appended through the REST bridge", &[], b.probe.events.load(Ordering::Relaxed) as f64);
        // Cluster mode: records for partitions another node leads.
        if let Some(fw) = &b.forwarder {
            let s = &fw.stats;
            for (outcome, n) in [("answered", &s.answered), ("failed", &s.failed)] {
                f.counter("canopy_rest_forwarded_requests_total", "Produce requests the REST bridge sent to partition leaders on other nodes, by outcome (answered, with the leader's refusals of partitions; failed: no answer)", &[("outcome", outcome.to_owned())], n.load(Ordering::Relaxed) as f64);
            }
            f.counter("canopy_rest_forwarded_bytes_total", "Record bytes the REST bridge sent to partition leaders on other nodes", &[], s.bytes.load(Ordering::Relaxed) as f64);
            f.gauge("canopy_rest_forward_links", "Connections open from this node's REST bridge to other nodes' inter-broker listeners", &[], fw.links(crate::kafka::replication::peers::Lane::Produce) as f64);
        }
    }

    /// Offsets, traffic and group lag, per topic or per branch.
    fn partitions(&self, f: &mut Families) {
        let topics = self.engine.topics();
        let names: Vec<&str> = topics.iter().map(|t| t.name()).collect();
        let labels = topic_labels(&names, self.topic_label_limit);
        let aggregated = topics.len() > self.topic_label_limit;
        f.gauge("canopy_topics", "Topics", &[], topics.len() as f64);
        f.gauge("canopy_partitions", "Partitions of all topics", &[], topics.iter().map(|t| t.partitions() as f64).sum());
        // (label, partition; None: all of them) -> (log start, high watermark, log end)
        let mut offsets: BTreeMap<(Label<'_>, Option<i32>), [f64; 3]> = BTreeMap::new();
        let mut traffic: BTreeMap<Label<'_>, [f64; 3]> = BTreeMap::new();
        let mut label_of: HashMap<[u8; 16], Label<'_>> = HashMap::with_capacity(topics.len());
        for t in &topics {
            let l = labels.of(t.name());
            label_of.insert(t.id(), l);
            let tr = &t.traffic.topic;
            let row = [tr.records_in.load(Ordering::Relaxed) as f64, tr.bytes_in.load(Ordering::Relaxed) as f64, tr.bytes_out.load(Ordering::Relaxed) as f64];
            let e = traffic.entry(l).or_default();
            (0..3).for_each(|i| e[i] += row[i]);
        }
        // One walk over storage's partitions, not a lookup per partition.
        self.engine.visit_offsets(|tp, ls, hw, leo| {
            let Some(&l) = label_of.get(&tp.topic) else { return };
            let e = offsets.entry((l, (!aggregated).then_some(tp.partition))).or_default();
            e[0] += ls as f64;
            e[1] += hw as f64;
            e[2] += leo as f64;
        });
        // The broker's totals, kept apart so a deleted topic does not take
        // its share with it (a counter must never go back).
        let total = &self.engine.config().probe.traffic;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
        f.counter("canopy_records_in_total", "Records appended (Kafka and REST)", &[], load(&total.records_in));
        f.counter("canopy_bytes_in_total", "Record batch bytes appended (Kafka and REST)", &[], load(&total.bytes_in));
        f.counter("canopy_bytes_out_total", "Record batch bytes returned to Kafka fetches (subtree streams included)", &[], load(&total.bytes_out));
        for (l, [r, bi, bo]) in &traffic {
            let labels = [("topic", l.to_string())];
            f.counter("canopy_topic_records_in_total", "Records appended, by topic (or branch)", &labels, *r);
            f.counter("canopy_topic_bytes_in_total", "Record batch bytes appended, by topic (or branch)", &labels, *bi);
            f.counter("canopy_topic_bytes_out_total", "Record batch bytes fetched, by topic (or branch)", &labels, *bo);
        }
        for ((l, p), [ls, hw, leo]) in &offsets {
            let labels = [("topic", l.to_string()), ("partition", p.map_or_else(|| "*".to_owned(), |p| p.to_string()))];
            f.gauge("canopy_log_start_offset", "First offset kept, by partition (summed per branch when aggregated)", &labels, *ls);
            f.gauge("canopy_high_watermark", "High watermark, by partition (summed per branch when aggregated)", &labels, *hw);
            f.gauge("canopy_log_end_offset", "Log end offset, by partition (summed per branch when aggregated)", &labels, *leo);
        }
        // Group lag: high watermark minus the committed offset.
        // Looked up per committed offset, not collected for every tp.
        let mut lag: BTreeMap<(String, String, Option<i32>), f64> = BTreeMap::new();
        for (g, topic, p, offset) in crate::kafka::coordinator::offsets::all_committed(self.engine.catalog()) {
            let Some(t) = self.engine.topic(&topic) else { continue };
            let Some((_, hw, _)) = self.engine.offsets(&t.tp(p)) else { continue };
            *lag.entry((g, labels.of(t.name()).to_string(), (!aggregated).then_some(p))).or_default() += (hw - offset).max(0) as f64;
        }
        for ((g, l, p), v) in lag {
            let p = p.map_or_else(|| "*".to_owned(), |p| p.to_string());
            f.gauge("canopy_consumer_group_lag", "Records between a group's committed offset and the high watermark", &[("group", g), ("topic", l), ("partition", p)], v);
        }
    }

    fn storage(&self, f: &mut Families) {
        let tip = self.engine.tip_stats();
        f.gauge("canopy_tip_bytes", "Bytes of batches held in the in-memory tip", &[], tip.bytes_used as f64);
        f.gauge("canopy_tip_batches", "Batches held in the tip", &[], tip.batches as f64);
        f.gauge("canopy_tip_branches", "Branches with batches in the tip", &[], tip.branches as f64);
        f.gauge("canopy_tip_oldest_sequence", "Stream sequence number of the oldest batch in the tip (0: empty)", &[], tip.oldest_seq.unwrap_or(0) as f64);
        f.gauge("canopy_tip_pool_blocks", "Blocks of the tip's shared pool, by state", &[("state", "used".into())], tip.blocks_in_use as f64);
        f.gauge("canopy_tip_pool_blocks", "Blocks of the tip's shared pool, by state", &[("state", "free".into())], tip.blocks_free as f64);
        f.counter("canopy_tip_reads_total", "Reads by where they were served (hit: the tip; miss: the logs)", &[("result", "hit".into())], tip.hits as f64);
        f.counter("canopy_tip_reads_total", "Reads by where they were served (hit: the tip; miss: the logs)", &[("result", "miss".into())], tip.misses as f64);
        let s = self.engine.storage();
        let r = s.read_stats();
        f.counter("canopy_disk_read_scanned_bytes_total", "Bytes read from log and store files by fetches (tip hits excluded)", &[], r.scanned.load(Ordering::Relaxed) as f64);
        f.counter("canopy_disk_read_delivered_bytes_total", "Bytes those disk reads returned (scanned / delivered is the read amplification)", &[], r.delivered.load(Ordering::Relaxed) as f64);
        let (held, dropped) = s.page_cache_window();
        f.gauge("canopy_page_cache_window_bytes", "Synced segment bytes the page-cache window leaves cached (page_cache_bytes bounds it)", &[], held as f64);
        f.counter("canopy_page_cache_dropped_bytes_total", "Segment bytes the page cache was told it may drop: synced past the window, or read from below it", &[], dropped as f64);
        let c = s.compaction_stats();
        f.gauge("canopy_compaction_lag_seconds", "How long the oldest sealed segment not yet compacted has waited past its lag", &[], c.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0);
        f.counter("canopy_compaction_windows_total", "Compaction windows completed", &[], c.windows.load(Ordering::Relaxed) as f64);
        f.counter("canopy_compaction_read_bytes_total", "Segment bytes compacted into subtree stores", &[], c.bytes_compacted.load(Ordering::Relaxed) as f64);
        f.counter("canopy_compaction_written_bytes_total", "Subtree store bytes written", &[], c.bytes_written.load(Ordering::Relaxed) as f64);
        f.counter("canopy_compaction_stores_written_total", "Subtree stores written", &[], c.stores_written.load(Ordering::Relaxed) as f64);
        f.counter("canopy_compaction_stores_deleted_total", "Subtree stores deleted by retention", &[], c.stores_deleted.load(Ordering::Relaxed) as f64);
        f.counter("canopy_cleaner_runs_total", "Key compactions of keyed topics completed", &[], c.cleanings.load(Ordering::Relaxed) as f64);
        f.counter("canopy_cleaner_read_bytes_total", "Store bytes key compaction replaced", &[], c.bytes_cleaned.load(Ordering::Relaxed) as f64);
        f.counter("canopy_cleaner_written_bytes_total", "Store bytes key compaction wrote", &[], c.bytes_cleaned_out.load(Ordering::Relaxed) as f64);
    }
}

/// The scrape while storage recovers, before the engine exists: the
/// build, `canopy_ready 0` and the process, so a dashboard sees a broker
/// that is starting rather than one that is gone.
pub fn recovering(health: &Health) -> String {
    let mut f = Families::default();
    identity(&mut f, health);
    #[cfg(target_os = "linux")]
    let registered = prometheus::core::Collector::collect(&prometheus::process_collector::ProcessCollector::for_self());
    #[cfg(not(target_os = "linux"))]
    let registered = Vec::new();
    encode(registered, f)
}

/// The text exposition of `registered` and the families built at scrape
/// time, sorted by name.
fn encode(mut registered: Vec<MetricFamily>, built: Families) -> String {
    registered.extend(built.0.into_values());
    registered.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    TextEncoder::new().encode(&registered, &mut out).expect("text encoding");
    String::from_utf8(out).expect("text format is UTF-8")
}

fn error_name(code: i16) -> String {
    kafka_protocol::ResponseError::try_from_code(code).map_or_else(|| code.to_string(), |e| format!("{e:?}"))
}

fn identity(f: &mut Families, health: &Health) {
    f.gauge("canopy_build_info", "Canopy's version (value 1)", &[("version", env!("CARGO_PKG_VERSION").to_owned())], 1.0);
    f.gauge("canopy_ready", "1 once recovery is done and the listeners serve", &[], health.ready.load(Ordering::Acquire) as u8 as f64);
}

fn connections(f: &mut Families, listener: &str, c: &ConnectionStats) {
    let l = [("listener", listener.to_owned())];
    f.gauge("canopy_connections_open", "Open client connections, by listener", &l, c.open.load(Ordering::Relaxed) as f64);
    f.counter("canopy_connections_accepted_total", "Client connections accepted, by listener", &l, c.accepted.load(Ordering::Relaxed) as f64);
    f.counter("canopy_connections_rejected_total", "Client connections refused at the connection limit, by listener", &l, c.rejected.load(Ordering::Relaxed) as f64);
}

/// Families by name, so samples with the same name share one.
#[derive(Default)]
struct Families(BTreeMap<String, MetricFamily>);

impl Families {
    fn sample(&mut self, name: &str, help: &str, kind: MetricType, labels: &[(&str, String)], value: f64) {
        let fam = self.0.entry(name.to_owned()).or_insert_with(|| {
            let mut m = MetricFamily::default();
            m.set_name(name.to_owned());
            m.set_help(help.to_owned());
            m.set_field_type(kind);
            m
        });
        let mut m = Metric::from_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name((*k).to_owned());
                    l.set_value(v.clone());
                    l
                })
                .collect(),
        );
        match kind {
            MetricType::COUNTER => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            _ => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        fam.mut_metric().push(m);
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, String)], value: f64) {
        self.sample(name, help, MetricType::COUNTER, labels, value)
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, String)], value: f64) {
        self.sample(name, help, MetricType::GAUGE, labels, value)
    }
}

/// The label of each topic: itself while there are at most `limit`
/// topics; else its branch (`a.b.*` for `a.b.c`), cut to shorter
/// prefixes until at most `limit` labels remain (`*` at the end: all).
/// How a topic is labelled in metrics: by its name, or, past the label
/// limit, by the first segments of its name (shared with its siblings), or
/// all together. Borrowed from the name: labelling a million topics
/// allocates nothing per topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Label<'a> {
    Name(&'a str),
    /// Rendered `<prefix>.*`.
    Prefix(&'a str),
    All,
}

impl std::fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Name(n) => f.write_str(n),
            Label::Prefix(p) => write!(f, "{p}.*"),
            Label::All => f.write_str("*"),
        }
    }
}

#[cfg(test)]
impl PartialEq<&str> for Label<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.to_string() == *other
    }
}

/// The labels of a set of topics: each its own name, or past the limit
/// the first few segments of each name (one depth for all, the deepest
/// that stays within the limit), or one label for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    Own,
    Prefix(usize),
    All,
}

impl Labels {
    /// The label of `name` (one of the topics the labels were chosen for).
    pub fn of<'a>(&self, name: &'a str) -> Label<'a> {
        match *self {
            Labels::Own => Label::Name(name),
            Labels::Prefix(depth) => prefix(name, depth),
            Labels::All => Label::All,
        }
    }
}

/// The first `depth` segments of `name` (never all of them), else all.
fn prefix(name: &str, depth: usize) -> Label<'_> {
    match name.match_indices('.').nth(depth.saturating_sub(1)) {
        Some((dot, _)) if depth > 0 => Label::Prefix(&name[..dot]),
        _ => Label::All,
    }
}

pub fn topic_labels(names: &[&str], limit: usize) -> Labels {
    if names.len() <= limit {
        return Labels::Own;
    }
    let deepest = names.iter().map(|n| n.bytes().filter(|&b| b == b'.').count() + 1).max().unwrap_or(1);
    for depth in (1..deepest).rev() {
        let mut distinct: HashSet<Label<'_>> = HashSet::new();
        // Stops counting once past the limit.
        if names.iter().all(|n| {
            distinct.insert(prefix(n, depth));
            distinct.len() <= limit
        }) {
            return Labels::Prefix(depth);
        }
    }
    Labels::All
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_their_own_label_until_the_limit_then_their_branch() {
        let names = ["app.codestore.commits", "app.codestore.pushes", "app.web.clicks", "solo"];
        let own = topic_labels(&names, 4);
        assert_eq!(own.of("app.web.clicks"), "app.web.clicks");
        let branch = topic_labels(&names, 3);
        assert_eq!(branch.of("app.codestore.commits"), "app.codestore.*");
        assert_eq!(branch.of("app.web.clicks"), "app.web.*");
        assert_eq!(branch.of("solo"), "*");
        let top = topic_labels(&names, 2);
        assert_eq!(top.of("app.codestore.commits"), "app.*");
        assert_eq!(top.of("solo"), "*");
        let all = topic_labels(&names, 1);
        assert!(names.iter().all(|n| all.of(n) == "*"));
    }

    #[test]
    fn a_hundred_thousand_flat_topics_collapse_into_one_label() {
        let names: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let l = topic_labels(&refs, 1000);
        assert_eq!(refs.iter().map(|n| l.of(n)).collect::<HashSet<_>>().len(), 1);
    }
}
