//! One typed configuration, layered: defaults → TOML file (`--config`) →
//! `CANOPY_*` environment → command-line flags. Every key is declared once,
//! in the `settings!` table below, which generates the flag, the environment
//! variable, the TOML field and the help text together, so they cannot
//! drift. Values are validated at start-up and an error names the key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use serde::Deserialize;

use crate::engine::{EngineConfig, FlushPolicy, TimestampType, TopicDefaults};
use crate::storage::StorageConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        <LogFormat as ValueEnum>::from_str(s, false)
    }
}

/// A flush policy as written in config: `always`, `never`, `interval:<ms>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush(pub FlushPolicy);

impl std::str::FromStr for Flush {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(Flush)
    }
}

impl<'de> Deserialize<'de> for Flush {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

macro_rules! settings {
    ($( $help:literal $name:ident : $ty:ty = $default:literal, $env:literal, $flag:literal; )*) => {
        /// Flags of `canopy serve`. Each also reads `CANOPY_<KEY>` and the
        /// TOML key of the same name (snake_case).
        #[derive(clap::Args, Debug, Default, Clone)]
        pub struct ServeArgs {
            /// TOML configuration file; its keys are the flag names with `_` for `-`.
            #[arg(long = "config", env = "CANOPY_CONFIG", value_name = "FILE")]
            pub config: Option<PathBuf>,
            $(
                #[arg(long = $flag, env = $env, help = concat!($help, " [default: ", $default, "]"))]
                pub $name: Option<$ty>,
            )*
        }

        #[derive(Deserialize, Default, Debug)]
        #[serde(deny_unknown_fields)]
        struct FileConfig {
            $( $name: Option<$ty>, )*
        }

        /// The resolved configuration.
        #[derive(Debug, Clone)]
        pub struct Config {
            $( pub $name: $ty, )*
            /// The settings the file, environment or flags gave (the rest
            /// are defaults): DescribeConfigs reports them as static.
            pub explicit: std::collections::BTreeSet<&'static str>,
        }

        impl Config {
            fn layer(file: FileConfig, args: &ServeArgs) -> Config {
                let explicit = [$( (stringify!($name), args.$name.is_some() || file.$name.is_some()) ),*]
                    .into_iter()
                    .filter_map(|(name, set)| set.then_some(name))
                    .collect();
                Config { explicit, $( $name: args.$name.clone().or(file.$name).unwrap_or_else(|| {
                    $default.parse().expect(concat!("the default of ", stringify!($name), " parses"))
                }), )* }
            }
        }
    };
}

settings! {
    "Directory holding the catalog and the branch logs"
    data_dir: PathBuf = "./canopy-data", "CANOPY_DATA_DIR", "data-dir";
    "Kafka listener address (HOST:PORT)"
    kafka_listener: SocketAddr = "127.0.0.1:9092", "CANOPY_KAFKA_LISTENER", "kafka-listener";
    "Admin HTTP listener (/health, /ready) (HOST:PORT)"
    admin_listener: SocketAddr = "127.0.0.1:9644", "CANOPY_ADMIN_LISTENER", "admin-listener";
    "Address of the REST bridge (Confluent REST Proxy API); empty: no REST listener"
    rest_listener: String = "127.0.0.1:8082", "CANOPY_REST_LISTENER", "rest-listener";
    "TOML file of REST principals (name, token_sha256, produce patterns; HTTP Basic checks the SCRAM users); empty: REST needs no credentials unless rest_require_authentication"
    principals_file: String = "", "CANOPY_PRINCIPALS_FILE", "principals-file";
    "Decoded REST body bytes all requests may hold at once (past it: 503 with Retry-After)"
    rest_max_in_flight_bytes: usize = "268435456", "CANOPY_REST_MAX_IN_FLIGHT_BYTES", "rest-max-in-flight-bytes";
    "REST requests per second per principal (0: no limit; past it: 429 with Retry-After)"
    rest_rate_limit_per_sec: u32 = "0", "CANOPY_REST_RATE_LIMIT_PER_SEC", "rest-rate-limit-per-sec";
    "Ask every REST request for credentials even without a principals file: HTTP Basic is then checked against the SCRAM users (as SASL PLAIN is)"
    rest_require_authentication: bool = "false", "CANOPY_REST_REQUIRE_AUTHENTICATION", "rest-require-authentication";
    "Largest REST request body, in bytes, after decompression (larger: 413)"
    rest_max_body_bytes: usize = "16777216", "CANOPY_REST_MAX_BODY_BYTES", "rest-max-body-bytes";
    "Open REST connections; one more is answered 503 and closed"
    rest_max_connections: usize = "10000", "CANOPY_REST_MAX_CONNECTIONS", "rest-max-connections";
    "Largest REST request head (start line and headers), in bytes (larger: 431)"
    rest_max_header_bytes: usize = "16384", "CANOPY_REST_MAX_HEADER_BYTES", "rest-max-header-bytes";
    "Longest REST request URI, in bytes (longer: 414)"
    rest_max_uri_bytes: usize = "8192", "CANOPY_REST_MAX_URI_BYTES", "rest-max-uri-bytes";
    "Milliseconds a REST request head may take to arrive, also the keep-alive idle limit (then the connection is closed)"
    rest_idle_timeout_ms: u64 = "30000", "CANOPY_REST_IDLE_TIMEOUT_MS", "rest-idle-timeout-ms";
    "Milliseconds a REST request body may take to arrive (past it: 408)"
    rest_body_timeout_ms: u64 = "30000", "CANOPY_REST_BODY_TIMEOUT_MS", "rest-body-timeout-ms";
    "Concurrent small REST requests for one partition share one record batch"
    rest_coalesce: bool = "true", "CANOPY_REST_COALESCE", "rest-coalesce";
    "TOML file of per-topic /ingest defaults ([[route]] topics, acks, key); empty: none"
    rest_routes_file: String = "", "CANOPY_REST_ROUTES_FILE", "rest-routes-file";
    "PEM certificate chain for TLS on the REST listener (with rest_tls_key_file; empty: cleartext HTTP/1.1 and h2c)"
    rest_tls_cert_file: String = "", "CANOPY_REST_TLS_CERT_FILE", "rest-tls-cert-file";
    "PEM private key for TLS on the REST listener"
    rest_tls_key_file: String = "", "CANOPY_REST_TLS_KEY_FILE", "rest-tls-key-file";
    "Record metrics (off: probes record nothing; /metrics still answers)"
    metrics_enabled: bool = "true", "CANOPY_METRICS_ENABLED", "metrics-enabled";
    "Topics that get their own metric labels; past it, series are summed per branch"
    metrics_topic_label_limit: usize = "1000", "CANOPY_METRICS_TOPIC_LABEL_LIMIT", "metrics-topic-label-limit";
    "HOST:PORT given to clients in Metadata (empty: the bound Kafka address)"
    advertised_listener: String = "", "CANOPY_ADVERTISED_LISTENER", "advertised-listener";
    "Kafka listeners, NAME://HOST:PORT separated by commas (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, or names mapped in listener_security_protocol_map); empty: one PLAINTEXT listener on kafka_listener"
    listeners: String = "", "CANOPY_LISTENERS", "listeners";
    "Addresses given to clients per listener, NAME://HOST:PORT separated by commas; a listener not named advertises the address it bound"
    advertised_listeners: String = "", "CANOPY_ADVERTISED_LISTENERS", "advertised-listeners";
    "Security protocol of each custom listener name, NAME:PROTOCOL separated by commas"
    listener_security_protocol_map: String = "", "CANOPY_LISTENER_SECURITY_PROTOCOL_MAP", "listener-security-protocol-map";
    "PEM certificate chain of the SSL and SASL_SSL listeners"
    ssl_cert_file: String = "", "CANOPY_SSL_CERT_FILE", "ssl-cert-file";
    "PEM private key of the SSL and SASL_SSL listeners"
    ssl_key_file: String = "", "CANOPY_SSL_KEY_FILE", "ssl-key-file";
    "Client certificates on SSL listeners: none, requested or required (ssl.client.auth); the principal is the certificate's subject"
    ssl_client_auth: String = "none", "CANOPY_SSL_CLIENT_AUTH", "ssl-client-auth";
    "Client certificates per listener, NAME:none|requested|required separated by commas (listener.name.<name>.ssl.client.auth); listeners not named use ssl_client_auth"
    listener_ssl_client_auth: String = "", "CANOPY_LISTENER_SSL_CLIENT_AUTH", "listener-ssl-client-auth";
    "PEM certificates that client certificates must chain to"
    ssl_ca_file: String = "", "CANOPY_SSL_CA_FILE", "ssl-ca-file";
    "How a client certificate's subject becomes a principal name: RULE:pattern/replacement/[LU] and DEFAULT, separated by commas (ssl.principal.mapping.rules)"
    ssl_principal_mapping_rules: String = "DEFAULT", "CANOPY_SSL_PRINCIPAL_MAPPING_RULES", "ssl-principal-mapping-rules";
    "How often the TLS files are checked for changes (they also reload on SIGHUP), in milliseconds"
    ssl_reload_check_ms: u64 = "10000", "CANOPY_SSL_RELOAD_CHECK_MS", "ssl-reload-check-ms";
    "SASL mechanisms offered on SASL listeners, separated by commas: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER (needs sasl_oauthbearer_jwks_file)"
    sasl_enabled_mechanisms: String = "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN", "CANOPY_SASL_ENABLED_MECHANISMS", "sasl-enabled-mechanisms";
    "OAUTHBEARER: the JWKS file holding the keys tokens are signed with (read at start)"
    sasl_oauthbearer_jwks_file: String = "", "CANOPY_SASL_OAUTHBEARER_JWKS_FILE", "sasl-oauthbearer-jwks-file";
    "OAUTHBEARER: audiences a token must name one of, separated by commas (sasl.oauthbearer.expected.audience; empty: not checked)"
    sasl_oauthbearer_expected_audience: String = "", "CANOPY_SASL_OAUTHBEARER_EXPECTED_AUDIENCE", "sasl-oauthbearer-expected-audience";
    "OAUTHBEARER: the issuer a token must name (sasl.oauthbearer.expected.issuer; empty: not checked)"
    sasl_oauthbearer_expected_issuer: String = "", "CANOPY_SASL_OAUTHBEARER_EXPECTED_ISSUER", "sasl-oauthbearer-expected-issuer";
    "OAUTHBEARER: the claim that names the principal (sasl.oauthbearer.sub.claim.name)"
    sasl_oauthbearer_sub_claim_name: String = "sub", "CANOPY_SASL_OAUTHBEARER_SUB_CLAIM_NAME", "sasl-oauthbearer-sub-claim-name";
    "OAUTHBEARER: tolerated clock difference for expiry and not-before, in seconds (sasl.oauthbearer.clock.skew.seconds)"
    sasl_oauthbearer_clock_skew_seconds: u64 = "30", "CANOPY_SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS", "sasl-oauthbearer-clock-skew-seconds";
    "Longest a SASL session lasts before the client must re-authenticate, in milliseconds (connections.max.reauth.ms; 0: for ever)"
    connections_max_reauth_ms: i64 = "0", "CANOPY_CONNECTIONS_MAX_REAUTH_MS", "connections-max-reauth-ms";
    "A failed authentication is answered this much later, then its connection closed, in milliseconds (connection.failed.authentication.delay.ms)"
    connection_failed_authentication_delay_ms: u64 = "100", "CANOPY_CONNECTION_FAILED_AUTHENTICATION_DELAY_MS", "connection-failed-authentication-delay-ms";
    "Largest request before authentication on a SASL listener, in bytes (sasl.server.max.receive.size; max_request_bytes if smaller)"
    sasl_max_receive_bytes: usize = "524288", "CANOPY_SASL_MAX_RECEIVE_BYTES", "sasl-max-receive-bytes";
    "Check every request against ACLs (Kafka's StandardAuthorizer); off: every principal may do everything, but only super users manage SCRAM credentials"
    authorizer_enabled: bool = "false", "CANOPY_AUTHORIZER_ENABLED", "authorizer-enabled";
    "With the authorizer: a resource no ACL names is open to everyone (allow.everyone.if.no.acl.found)"
    allow_everyone_if_no_acl_found: bool = "false", "CANOPY_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "allow-everyone-if-no-acl-found";
    "Principals allowed everything, separated by semicolons (super.users: User:admin;User:ops)"
    super_users: String = "", "CANOPY_SUPER_USERS", "super-users";
    "Log output format: text or json (filter with RUST_LOG)"
    log_format: LogFormat = "text", "CANOPY_LOG_FORMAT", "log-format";
    "Flush policy: always (acks=all waits for fsync), interval:<ms>, never"
    flush: Flush = "always", "CANOPY_FLUSH", "flush";
    "Create topics on first Metadata or Produce request"
    auto_create_topics: bool = "true", "CANOPY_AUTO_CREATE_TOPICS", "auto-create-topics";
    "Partition count of auto-created topics (Kafka's num.partitions)"
    num_partitions: i32 = "1", "CANOPY_NUM_PARTITIONS", "num-partitions";
    "Copies of each partition of topics created without a replication factor (Kafka's default.replication.factor; above 1 only in cluster mode)"
    default_replication_factor: i16 = "1", "CANOPY_DEFAULT_REPLICATION_FACTOR", "default-replication-factor";
    "Largest request frame accepted, in bytes (socket.request.max.bytes)"
    max_request_bytes: usize = "104857600", "CANOPY_MAX_REQUEST_BYTES", "max-request-bytes";
    "Requests read ahead of their responses on one connection"
    max_in_flight_per_connection: usize = "64", "CANOPY_MAX_IN_FLIGHT_PER_CONNECTION", "max-in-flight-per-connection";
    "Open Kafka connections; more wait in the listen backlog"
    max_connections: usize = "10000", "CANOPY_MAX_CONNECTIONS", "max-connections";
    "Open Kafka connections from one address; more are closed at once (max.connections.per.ip)"
    max_connections_per_ip: usize = "1000", "CANOPY_MAX_CONNECTIONS_PER_IP", "max-connections-per-ip";
    "Request bytes the Kafka and REST listeners hold in memory at once, broker-wide (queued.max.request.bytes): a Kafka connection whose next request does not fit is not read until it does, a REST request gets 503"
    queued_max_request_bytes: usize = "536870912", "CANOPY_QUEUED_MAX_REQUEST_BYTES", "queued-max-request-bytes";
    "A Kafka connection with nothing in flight that sends nothing this long is closed, in milliseconds (connections.max.idle.ms)"
    connections_max_idle_ms: u64 = "600000", "CANOPY_CONNECTIONS_MAX_IDLE_MS", "connections-max-idle-ms";
    "A Kafka response the client does not take within this closes its connection, in milliseconds"
    response_write_timeout_ms: u64 = "30000", "CANOPY_RESPONSE_WRITE_TIMEOUT_MS", "response-write-timeout-ms";
    "Longest a graceful shutdown waits for clients to finish their requests, in milliseconds; then their connections are dropped"
    shutdown_timeout_ms: u64 = "30000", "CANOPY_SHUTDOWN_TIMEOUT_MS", "shutdown-timeout-ms";
    "Synced segment bytes left in the page cache, the newest; older pages are dropped, and so are pages read from below them: new writes reuse the pages the oldest free, instead of memory touched for the first time, which on a VM that gives free memory back to its host costs more than the rest of a produced byte (-1: keep everything cached, as Kafka does)"
    page_cache_bytes: i64 = "1073741824", "CANOPY_PAGE_CACHE_BYTES", "page-cache-bytes";
    "Segment and store files kept open at most; the least recently used are closed (0: a share of the descriptor limit left after the connection limits)"
    max_open_files: usize = "0", "CANOPY_MAX_OPEN_FILES", "max-open-files";
    "Threads that inflate, recompress and check heavy produced batches and REST bodies, off the async workers (0: one per core)"
    validation_threads: usize = "0", "CANOPY_VALIDATION_THREADS", "validation-threads";
    "Topics one Metadata or Produce request may auto-create; the rest are answered LEADER_NOT_AVAILABLE, which clients retry"
    max_auto_create_per_request: usize = "100", "CANOPY_MAX_AUTO_CREATE_PER_REQUEST", "max-auto-create-per-request";
    "Topics auto-created per second, broker-wide (0: no limit); past it, as past the per-request bound"
    auto_create_topics_per_sec: u32 = "100", "CANOPY_AUTO_CREATE_TOPICS_PER_SEC", "auto-create-topics-per-sec";
    "Open connections to the admin listener (/health, /ready, /metrics); one more is answered 503"
    admin_max_connections: usize = "64", "CANOPY_ADMIN_MAX_CONNECTIONS", "admin-max-connections";
    "Default largest record batch, in bytes (message.max.bytes)"
    message_max_bytes: i32 = "1048588", "CANOPY_MESSAGE_MAX_BYTES", "message-max-bytes";
    "Largest size a compressed batch may inflate to while it is validated, in bytes; a broker setting no topic config raises (max.message.bytes bounds the compressed size)"
    max_inflated_batch_bytes: usize = "16777216", "CANOPY_MAX_INFLATED_BATCH_BYTES", "max-inflated-batch-bytes";
    "Default message.timestamp.before.max.ms of topics: CreateTime records older than this are refused"
    message_timestamp_before_max_ms: i64 = "9223372036854775807", "CANOPY_MESSAGE_TIMESTAMP_BEFORE_MAX_MS", "message-timestamp-before-max-ms";
    "Default message.timestamp.after.max.ms of topics: CreateTime records further ahead than this are refused"
    message_timestamp_after_max_ms: i64 = "3600000", "CANOPY_MESSAGE_TIMESTAMP_AFTER_MAX_MS", "message-timestamp-after-max-ms";
    "Roll a branch's active segment at this size, in bytes"
    segment_bytes: u64 = "1073741824", "CANOPY_SEGMENT_BYTES", "segment-bytes";
    "Roll a branch's active segment at this age, in milliseconds"
    segment_ms: i64 = "604800000", "CANOPY_SEGMENT_MS", "segment-ms";
    "Compact a sealed segment into subtree stores once it has been sealed this long, in milliseconds (-1: never compact)"
    compaction_lag_ms: i64 = "3600000", "CANOPY_COMPACTION_LAG_MS", "compaction-lag-ms";
    "How often the compactor looks for due segments, in milliseconds"
    compaction_interval_ms: u64 = "60000", "CANOPY_COMPACTION_INTERVAL_MS", "compaction-interval-ms";
    "How a compaction window is split into stores: adaptive (by volume) or prefix3 (first three name segments)"
    compaction_split: String = "adaptive", "CANOPY_COMPACTION_SPLIT", "compaction-split";
    "Adaptive split: at most this many stores per window (0: no limit)"
    compaction_max_stores: usize = "0", "CANOPY_COMPACTION_MAX_STORES", "compaction-max-stores";
    "Adaptive split: no store below this size but the last, in bytes; a topic this large gets a store of its own"
    compaction_min_store_bytes: u64 = "67108864", "CANOPY_COMPACTION_MIN_STORE_BYTES", "compaction-min-store-bytes";
    "Segment bytes one compaction window takes at most"
    compaction_max_window_bytes: u64 = "4294967296", "CANOPY_COMPACTION_MAX_WINDOW_BYTES", "compaction-max-window-bytes";
    "Bytes per second the compactor reads at most (0: no limit)"
    compaction_bytes_per_sec: u64 = "104857600", "CANOPY_COMPACTION_BYTES_PER_SEC", "compaction-bytes-per-sec";
    "Memory the log cleaner's key map may use per run (log.cleaner.dedupe.buffer.size), in bytes"
    log_cleaner_dedupe_buffer_bytes: u64 = "134217728", "CANOPY_LOG_CLEANER_DEDUPE_BUFFER_BYTES", "log-cleaner-dedupe-buffer-bytes";
    "Default retention.ms of topics (-1: keep forever)"
    retention_ms: i64 = "604800000", "CANOPY_RETENTION_MS", "retention-ms";
    "Default retention.bytes per partition (-1: no limit)"
    retention_bytes: i64 = "-1", "CANOPY_RETENTION_BYTES", "retention-bytes";
    "How often retention runs, in milliseconds"
    retention_check_interval_ms: u64 = "300000", "CANOPY_RETENTION_CHECK_INTERVAL_MS", "retention-check-interval-ms";
    "Default message.timestamp.type of topics: CreateTime or LogAppendTime"
    message_timestamp_type: String = "CreateTime", "CANOPY_MESSAGE_TIMESTAMP_TYPE", "message-timestamp-type";
    "Longest a Fetch may wait for data, whatever max_wait_ms it asks, in milliseconds"
    max_fetch_wait_ms: u64 = "30000", "CANOPY_MAX_FETCH_WAIT_MS", "max-fetch-wait-ms";
    "Most record bytes one Fetch may return, whatever it asks (fetch.max.bytes)"
    fetch_max_bytes: usize = "57671680", "CANOPY_FETCH_MAX_BYTES", "fetch-max-bytes";
    "Most fetch sessions (KIP-227) kept at once (max.incremental.fetch.session.cache.slots); 0 turns sessions off"
    max_incremental_fetch_session_cache_slots: usize = "1000", "CANOPY_MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS", "max-incremental-fetch-session-cache-slots";
    "Most partitions all fetch sessions hold together (bounds the cache's memory, about 100 bytes each)"
    max_incremental_fetch_session_cache_partitions: usize = "1000000", "CANOPY_MAX_INCREMENTAL_FETCH_SESSION_CACHE_PARTITIONS", "max-incremental-fetch-session-cache-partitions";
    "Largest number of topics"
    max_topics: usize = "1000000", "CANOPY_MAX_TOPICS", "max-topics";
    "A new group waits this long for more members before its first rebalance (group.initial.rebalance.delay.ms)"
    group_initial_rebalance_delay_ms: i64 = "3000", "CANOPY_GROUP_INITIAL_REBALANCE_DELAY_MS", "group-initial-rebalance-delay-ms";
    "Smallest session timeout a group member may ask for (group.min.session.timeout.ms)"
    group_min_session_timeout_ms: i32 = "6000", "CANOPY_GROUP_MIN_SESSION_TIMEOUT_MS", "group-min-session-timeout-ms";
    "Largest session timeout a group member may ask for (group.max.session.timeout.ms)"
    group_max_session_timeout_ms: i32 = "1800000", "CANOPY_GROUP_MAX_SESSION_TIMEOUT_MS", "group-max-session-timeout-ms";
    "Most members in one group (group.max.size)"
    group_max_size: usize = "1000", "CANOPY_GROUP_MAX_SIZE", "group-max-size";
    "A consumer-protocol (KIP-848) member not heard from this long leaves its group (group.consumer.session.timeout.ms)"
    group_consumer_session_timeout_ms: i64 = "45000", "CANOPY_GROUP_CONSUMER_SESSION_TIMEOUT_MS", "group-consumer-session-timeout-ms";
    "How often consumer-protocol members heartbeat (group.consumer.heartbeat.interval.ms)"
    group_consumer_heartbeat_interval_ms: i32 = "5000", "CANOPY_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS", "group-consumer-heartbeat-interval-ms";
    "Most members in one consumer-protocol group (group.consumer.max.size)"
    group_consumer_max_size: usize = "1000", "CANOPY_GROUP_CONSUMER_MAX_SIZE", "group-consumer-max-size";
    "Committed offsets of a group without members expire after this (offsets.retention.minutes)"
    offsets_retention_minutes: i64 = "10080", "CANOPY_OFFSETS_RETENTION_MINUTES", "offsets-retention-minutes";
    "Idempotent-producer state of a producer idle this long is forgotten (producer.id.expiration.ms)"
    producer_id_expiration_ms: i64 = "86400000", "CANOPY_PRODUCER_ID_EXPIRATION_MS", "producer-id-expiration-ms";
    "Longest transaction timeout a producer may ask for (transaction.max.timeout.ms)"
    transaction_max_timeout_ms: i32 = "900000", "CANOPY_TRANSACTION_MAX_TIMEOUT_MS", "transaction-max-timeout-ms";
    "A transactional id idle this long is forgotten (transactional.id.expiration.ms)"
    transactional_id_expiration_ms: i64 = "604800000", "CANOPY_TRANSACTIONAL_ID_EXPIRATION_MS", "transactional-id-expiration-ms";
    "The transaction protocol clients are told to use (the finalized feature transaction.version): 2 is transactions v2 (KIP-890 part 2, an epoch per transaction), 0 or 1 the protocol before it"
    transaction_version: i16 = "2", "CANOPY_TRANSACTION_VERSION", "transaction-version";
    "How often timed-out transactions are looked for and aborted, in milliseconds"
    transaction_timeout_check_ms: u64 = "1000", "CANOPY_TRANSACTION_TIMEOUT_CHECK_MS", "transaction-timeout-check-ms";
    "Bytes of the newest batches kept in memory, broker-wide (the tip; 0 turns it off)"
    tip_bytes: usize = "268435456", "CANOPY_TIP_BYTES", "tip-bytes";
    "Blocks of 1024 index entries the tip's branch indexes share"
    tip_index_blocks: usize = "8192", "CANOPY_TIP_INDEX_BLOCKS", "tip-index-blocks";
    "How a read finds its batches in the tip: index (per-branch index) or scan (linear pass, the baseline)"
    tip_lookup: String = "index", "CANOPY_TIP_LOOKUP", "tip-lookup";
    "Appends queued for the writer thread before producers wait"
    write_queue: usize = "4096", "CANOPY_WRITE_QUEUE", "write-queue";
    "This broker's id (node.id); in cluster mode unique among the cluster's brokers"
    node_id: i32 = "0", "CANOPY_NODE_ID", "node-id";
    "Cluster mode: etcd client URLs separated by commas (http://host:port); empty: single-node mode. Needs a build with the cluster feature"
    etcd_endpoints: String = "", "CANOPY_ETCD_ENDPOINTS", "etcd-endpoints";
    "Cluster mode: the cluster's name, its etcd keys are under /canopy/<name>/ (one etcd can hold several clusters)"
    cluster_name: String = "canopy", "CANOPY_CLUSTER_NAME", "cluster-name";
    "The rack of this broker (broker.rack), for replica placement; empty: none"
    broker_rack: String = "", "CANOPY_BROKER_RACK", "broker-rack";
    "Cluster mode: a broker whose etcd lease is not renewed for this long leaves the cluster, in milliseconds (broker.session.timeout.ms; etcd rounds up to whole seconds)"
    broker_session_timeout_ms: u64 = "3000", "CANOPY_BROKER_SESSION_TIMEOUT_MS", "broker-session-timeout-ms";
    "Cluster mode: a follower that has not caught up with its leader for this long leaves the ISR (Kafka's replica.lag.time.max.ms)"
    replica_lag_time_max_ms: i64 = "30000", "CANOPY_REPLICA_LAG_TIME_MAX_MS", "replica-lag-time-max-ms";
    "Cluster mode: how often the broker renews its etcd lease, in milliseconds (broker.heartbeat.interval.ms)"
    broker_heartbeat_interval_ms: u64 = "1000", "CANOPY_BROKER_HEARTBEAT_INTERVAL_MS", "broker-heartbeat-interval-ms";
    "Cluster mode: copies of each coordinator shard's log, which holds committed offsets (offsets.topic.replication.factor); until that many brokers are registered, coordinators are not available"
    offsets_topic_replication_factor: i16 = "3", "CANOPY_OFFSETS_TOPIC_REPLICATION_FACTOR", "offsets-topic-replication-factor";
    "Cluster mode: the listener brokers reach each other on (inter.broker.listener.name): followers fetch from their leaders there, and replica fetches are taken only there; PLAINTEXT, or SSL with client certificates required (each broker presents ssl_cert_file and checks the other's against ssl_ca_file); empty: the first listener"
    inter_broker_listener_name: String = "", "CANOPY_INTER_BROKER_LISTENER_NAME", "inter-broker-listener-name";
    "Cluster mode: a partition whose in-sync replicas are all gone may elect another live replica, losing what only they had (unclean.leader.election.enable; topic configs and the cluster-wide dynamic setting take precedence; the controller's own setting decides)"
    unclean_leader_election_enable: bool = "false", "CANOPY_UNCLEAN_LEADER_ELECTION_ENABLE", "unclean-leader-election-enable";
    "Cluster mode: the controller moves leadership back to preferred replicas when a broker leads too few of its own (auto.leader.rebalance.enable)"
    auto_leader_rebalance_enable: bool = "true", "CANOPY_AUTO_LEADER_REBALANCE_ENABLE", "auto-leader-rebalance-enable";
    "Cluster mode: how often the controller looks for leader imbalance, in milliseconds (leader.imbalance.check.interval.seconds)"
    leader_imbalance_check_interval_ms: u64 = "300000", "CANOPY_LEADER_IMBALANCE_CHECK_INTERVAL_MS", "leader-imbalance-check-interval-ms";
    "Cluster mode: the share of a broker's preferred units led elsewhere, in percent, past which they go back to it (leader.imbalance.per.broker.percentage)"
    leader_imbalance_per_broker_percentage: u32 = "10", "CANOPY_LEADER_IMBALANCE_PER_BROKER_PERCENTAGE", "leader-imbalance-per-broker-percentage";
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid value for {key}: {why}")]
    Invalid { key: &'static str, why: String },
}

impl Config {
    /// Resolves the layers and validates the result.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })?
            }
            None => FileConfig::default(),
        };
        let c = Config::layer(file, args);
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, why: &str| Err(ConfigError::Invalid { key, why: why.to_owned() });
        if self.default_replication_factor < 1 {
            return bad("default_replication_factor", "must be at least 1");
        }
        if self.offsets_topic_replication_factor < 1 {
            return bad("offsets_topic_replication_factor", "must be at least 1");
        }
        if self.num_partitions < 1 {
            return bad("num_partitions", "must be at least 1");
        }
        if self.node_id < 0 {
            return bad("node_id", "must be 0 or more");
        }
        if self.cluster().is_some() {
            if !cfg!(feature = "cluster") {
                return bad("etcd_endpoints", "this binary was built without cluster mode (cargo build --release --features cluster, which needs protoc)");
            }
            if !crate::cluster::keys::valid_cluster_name(&self.cluster_name) {
                return bad("cluster_name", "must be 1 to 64 letters, digits, '-', '_' or '.'");
            }
            if !(1000..=3_600_000).contains(&self.broker_session_timeout_ms) {
                return bad("broker_session_timeout_ms", "must be between 1000 and 3600000");
            }
            if self.broker_heartbeat_interval_ms == 0 || self.broker_heartbeat_interval_ms * 2 > self.broker_session_timeout_ms {
                return bad("broker_heartbeat_interval_ms", "must be positive and at most half of broker_session_timeout_ms");
            }
            if self.leader_imbalance_check_interval_ms < 1000 {
                return bad("leader_imbalance_check_interval_ms", "must be at least 1000");
            }
            if self.leader_imbalance_per_broker_percentage > 100 {
                return bad("leader_imbalance_per_broker_percentage", "must be between 0 and 100");
            }
        }
        if self.max_request_bytes < 1024 || self.max_request_bytes > i32::MAX as usize {
            return bad("max_request_bytes", "must be between 1024 and 2147483647");
        }
        if self.max_in_flight_per_connection == 0 {
            return bad("max_in_flight_per_connection", "must be at least 1");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if self.max_connections_per_ip == 0 {
            return bad("max_connections_per_ip", "must be at least 1");
        }
        if self.queued_max_request_bytes < self.max_request_bytes || self.queued_max_request_bytes < self.rest_max_body_bytes {
            return bad("queued_max_request_bytes", "must be at least max_request_bytes and rest_max_body_bytes (each request must fit alone)");
        }
        if self.connections_max_idle_ms == 0 || self.response_write_timeout_ms == 0 || self.shutdown_timeout_ms == 0 {
            return bad("connections_max_idle_ms", "connection timeouts (also response_write_timeout_ms, shutdown_timeout_ms) must be positive");
        }
        if self.admin_max_connections == 0 {
            return bad("admin_max_connections", "must be at least 1");
        }
        if self.max_inflated_batch_bytes < self.message_max_bytes as usize {
            return bad("max_inflated_batch_bytes", "must be at least message_max_bytes");
        }
        if self.message_max_bytes < 1024 {
            return bad("message_max_bytes", "must be at least 1024");
        }
        if self.segment_bytes < 4096 || self.segment_bytes > u32::MAX as u64 * 4 {
            return bad("segment_bytes", "must be between 4096 and 16 GiB");
        }
        if (self.message_max_bytes as u64) > self.segment_bytes {
            return bad("segment_bytes", "must be at least message_max_bytes");
        }
        if self.segment_ms < 1 {
            return bad("segment_ms", "must be positive");
        }
        if self.retention_ms < -1 {
            return bad("retention_ms", "must be -1 or more");
        }
        if self.retention_bytes < -1 {
            return bad("retention_bytes", "must be -1 or more");
        }
        if self.retention_check_interval_ms == 0 {
            return bad("retention_check_interval_ms", "must be positive");
        }
        if self.timestamp_type().is_none() {
            return bad("message_timestamp_type", "must be CreateTime or LogAppendTime");
        }
        if self.group_initial_rebalance_delay_ms < 0 {
            return bad("group_initial_rebalance_delay_ms", "must be 0 or more");
        }
        if self.group_consumer_session_timeout_ms < 1 {
            return bad("group_consumer_session_timeout_ms", "must be at least 1");
        }
        if self.group_consumer_heartbeat_interval_ms < 1 || self.group_consumer_heartbeat_interval_ms as i64 >= self.group_consumer_session_timeout_ms {
            return bad("group_consumer_heartbeat_interval_ms", "must be at least 1 and below group_consumer_session_timeout_ms");
        }
        if self.group_min_session_timeout_ms < 1 || self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            return bad("group_min_session_timeout_ms", "must be positive and at most group_max_session_timeout_ms");
        }
        if self.message_timestamp_before_max_ms < 0 {
            return bad("message_timestamp_before_max_ms", "must be 0 or more");
        }
        if self.message_timestamp_after_max_ms < 0 {
            return bad("message_timestamp_after_max_ms", "must be 0 or more");
        }
        if self.producer_id_expiration_ms < 1 {
            return bad("producer_id_expiration_ms", "must be positive");
        }
        if self.transaction_max_timeout_ms < 1 {
            return bad("transaction_max_timeout_ms", "must be positive");
        }
        if !(0..=crate::kafka::features::TRANSACTION_VERSION_MAX).contains(&self.transaction_version) {
            return bad("transaction_version", "must be 0, 1 or 2");
        }
        if self.transactional_id_expiration_ms < 1 {
            return bad("transactional_id_expiration_ms", "must be positive");
        }
        if self.transaction_timeout_check_ms < 10 {
            return bad("transaction_timeout_check_ms", "must be at least 10");
        }
        if let Err(why) = self.tip_lookup.parse::<crate::storage::tip::Lookup>() {
            return bad("tip_lookup", &why);
        }
        if self.tip_bytes > 0 && self.tip_index_blocks == 0 {
            return bad("tip_index_blocks", "must be at least 1 while the tip is on");
        }
        if self.page_cache_bytes < -1 {
            return bad("page_cache_bytes", "must be -1 (keep every page) or more");
        }
        if self.compaction_lag_ms < -1 {
            return bad("compaction_lag_ms", "must be -1 or more");
        }
        if self.compaction_interval_ms == 0 {
            return bad("compaction_interval_ms", "must be positive");
        }
        if let Err(why) = self.compaction_split.parse::<crate::storage::subtree::split::Strategy>() {
            return bad("compaction_split", &why);
        }
        if self.compaction_max_window_bytes == 0 {
            return bad("compaction_max_window_bytes", "must be positive");
        }
        if self.group_max_size == 0 {
            return bad("group_max_size", "must be at least 1");
        }
        if self.offsets_retention_minutes < 1 {
            return bad("offsets_retention_minutes", "must be at least 1");
        }
        if self.fetch_max_bytes < 1024 || self.fetch_max_bytes > 1 << 30 {
            return bad("fetch_max_bytes", "must be between 1024 and 1073741824");
        }
        if !self.rest_listener.is_empty() && self.rest_listener.parse::<SocketAddr>().is_err() {
            return bad("rest_listener", "must be HOST:PORT (an IP address) or empty");
        }
        if self.rest_max_body_bytes < 1024 {
            return bad("rest_max_body_bytes", "must be at least 1024");
        }
        if self.rest_max_connections == 0 {
            return bad("rest_max_connections", "must be at least 1");
        }
        if self.rest_max_header_bytes < 1024 || self.rest_max_header_bytes > 1 << 20 {
            return bad("rest_max_header_bytes", "must be between 1024 and 1048576");
        }
        if self.rest_max_uri_bytes < 256 {
            return bad("rest_max_uri_bytes", "must be at least 256");
        }
        if self.rest_idle_timeout_ms == 0 || self.rest_body_timeout_ms == 0 {
            return bad("rest_idle_timeout_ms", "timeouts must be positive");
        }
        if self.rest_tls_cert_file.is_empty() != self.rest_tls_key_file.is_empty() {
            return bad("rest_tls_cert_file", "TLS needs both rest_tls_cert_file and rest_tls_key_file");
        }
        if self.write_queue == 0 {
            return bad("write_queue", "must be at least 1");
        }
        if !self.advertised_listener.is_empty() {
            match self.advertised_listener.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => return bad("advertised_listener", "must be HOST:PORT"),
            }
        }
        let listeners = match self.kafka_listeners() {
            Ok(l) => l,
            Err(why) => return bad("listeners", &why),
        };
        if listeners.iter().any(|l| l.protocol.tls()) && (self.ssl_cert_file.is_empty() || self.ssl_key_file.is_empty()) {
            return bad("ssl_cert_file", "an SSL or SASL_SSL listener needs ssl_cert_file and ssl_key_file");
        }
        if let Err(why) = self.ssl_client_auth.parse::<crate::tls::ClientAuth>() {
            return bad("ssl_client_auth", &why);
        }
        for l in listeners.iter().filter(|l| l.protocol.tls()) {
            match self.client_auth_of(&l.name) {
                Err(why) => return bad("listener_ssl_client_auth", &why),
                Ok(crate::tls::ClientAuth::None) => {}
                Ok(_) if self.ssl_ca_file.is_empty() => return bad("ssl_ca_file", "client certificates (ssl_client_auth) need the CA file they chain to"),
                Ok(_) => {}
            }
        }
        for entry in self.listener_ssl_client_auth.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let name = entry.split_once(':').map(|(n, _)| n.trim().to_ascii_uppercase()).unwrap_or_default();
            if !listeners.iter().any(|l| l.name == name && l.protocol.tls()) {
                return bad("listener_ssl_client_auth", &format!("{entry:?} does not name an SSL or SASL_SSL listener"));
            }
        }
        if let Err(why) = crate::auth::mapping::PrincipalMapper::parse(&self.ssl_principal_mapping_rules) {
            return bad("ssl_principal_mapping_rules", &why);
        }
        if self.ssl_reload_check_ms < 100 {
            return bad("ssl_reload_check_ms", "must be at least 100");
        }
        match self.sasl_mechanisms() {
            Err(why) => return bad("sasl_enabled_mechanisms", &why),
            Ok(m) if m.is_empty() && listeners.iter().any(|l| l.protocol.sasl()) => return bad("sasl_enabled_mechanisms", "a SASL listener needs at least one mechanism"),
            Ok(m) if m.contains(&crate::auth::sasl::SaslMechanism::OAuthBearer) && self.sasl_oauthbearer_jwks_file.is_empty() => {
                return bad("sasl_oauthbearer_jwks_file", "OAUTHBEARER needs the JWKS its tokens are checked against")
            }
            Ok(_) => {}
        }
        if self.connections_max_reauth_ms < 0 {
            return bad("connections_max_reauth_ms", "must be 0 (no re-authentication) or more");
        }
        if let Err(why) = self.super_user_list() {
            return bad("super_users", &why);
        }
        if self.sasl_max_receive_bytes < 1024 {
            return bad("sasl_max_receive_bytes", "must be at least 1024");
        }
        if let Err(why) = self.inter_broker() {
            return bad("inter_broker_listener_name", &why);
        }
        Ok(())
    }

    /// How this broker reaches, and is reached by, the others: the
    /// listener named by `inter_broker_listener_name` (else the first),
    /// which must be PLAINTEXT, or SSL requiring client certificates (so
    /// each side of a link checks the other's certificate against
    /// `ssl_ca_file`). SASL between brokers is not built: a node would need
    /// credentials of its own to present. Single-node mode checks only the
    /// name.
    pub fn inter_broker(&self) -> Result<crate::kafka::InterBroker, String> {
        use crate::kafka::listener::SecurityProtocol;
        let listeners = self.kafka_listeners()?;
        let wanted = self.inter_broker_listener_name.trim().to_ascii_uppercase();
        let l = match wanted.as_str() {
            "" => &listeners[0],
            name => listeners.iter().find(|l| l.name == name).ok_or_else(|| format!("{name:?} is not one of the listeners"))?,
        };
        let tls = match l.protocol {
            // Single-node mode has no other broker to check.
            _ if self.cluster().is_none() => None,
            SecurityProtocol::Plaintext => None,
            SecurityProtocol::Ssl if self.client_auth_of(&l.name) == Ok(crate::tls::ClientAuth::Required) => {
                Some(crate::tls::PeerFiles { cert: self.ssl_cert_file.clone().into(), key: self.ssl_key_file.clone().into(), ca: self.ssl_ca_file.clone().into() })
            }
            SecurityProtocol::Ssl => return Err(format!("the SSL listener {} between brokers must require client certificates (listener_ssl_client_auth {}:required), so that each broker checks the other", l.name, l.name)),
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl => return Err(format!("{} is a SASL listener: SASL between brokers is not supported; use SSL with client certificates, or PLAINTEXT on a private network", l.name)),
        };
        Ok(crate::kafka::InterBroker { listener: l.name.clone(), tls })
    }

    /// The Kafka listeners: `listeners`, or else one PLAINTEXT listener on
    /// `kafka_listener` advertising `advertised_listener`.
    pub fn kafka_listeners(&self) -> Result<Vec<crate::kafka::listener::ListenerSpec>, String> {
        if self.listeners.is_empty() {
            if !self.advertised_listeners.is_empty() {
                return Err("advertised_listeners needs listeners".into());
            }
            let advertised = match self.advertised_listener.rsplit_once(':') {
                Some((h, p)) => Some((h.to_owned(), p.parse().map_err(|_| "advertised_listener must be HOST:PORT".to_owned())?)),
                None => None,
            };
            let protocol = crate::kafka::listener::SecurityProtocol::Plaintext;
            return Ok(vec![crate::kafka::listener::ListenerSpec { name: "PLAINTEXT".into(), protocol, bind: self.kafka_listener.to_string(), advertised }]);
        }
        crate::kafka::listener::parse(&self.listeners, &self.advertised_listeners, &self.listener_security_protocol_map)
    }

    /// `super_users` as principals.
    pub fn super_user_list(&self) -> Result<Vec<crate::auth::KafkaPrincipal>, String> {
        self.super_users
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|p| match p.split_once(':') {
                Some((kind, name)) if !kind.is_empty() && !name.is_empty() => Ok(crate::auth::KafkaPrincipal { kind: kind.to_owned(), name: name.to_owned() }),
                _ => Err(format!("{p:?} is not TYPE:NAME (User:admin)")),
            })
            .collect()
    }

    /// The SASL mechanisms offered, in the configured order.
    pub fn sasl_mechanisms(&self) -> Result<Vec<crate::auth::sasl::SaslMechanism>, String> {
        let mut out = Vec::new();
        for name in self.sasl_enabled_mechanisms.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let m = crate::auth::sasl::SaslMechanism::from_name(name).ok_or_else(|| format!("{name:?} is not one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER"))?;
            if !out.contains(&m) {
                out.push(m);
            }
        }
        Ok(out)
    }

    /// OAUTHBEARER's settings, when a JWKS file is configured.
    pub fn oauth(&self) -> Option<crate::auth::oauth::OAuthConfig> {
        if self.sasl_oauthbearer_jwks_file.is_empty() {
            return None;
        }
        let list = |s: &str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect::<Vec<_>>();
        Some(crate::auth::oauth::OAuthConfig {
            jwks_file: self.sasl_oauthbearer_jwks_file.clone().into(),
            audience: list(&self.sasl_oauthbearer_expected_audience),
            issuer: Some(self.sasl_oauthbearer_expected_issuer.clone()).filter(|i| !i.is_empty()),
            sub_claim: self.sasl_oauthbearer_sub_claim_name.clone(),
            clock_skew_s: self.sasl_oauthbearer_clock_skew_seconds,
        })
    }

    /// Whether listener `name` asks for client certificates.
    pub fn client_auth_of(&self, name: &str) -> Result<crate::tls::ClientAuth, String> {
        for entry in self.listener_ssl_client_auth.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (n, auth) = entry.split_once(':').ok_or_else(|| format!("{entry:?} is not NAME:none|requested|required"))?;
            if n.trim().eq_ignore_ascii_case(name) {
                return auth.trim().parse();
            }
        }
        self.ssl_client_auth.parse()
    }

    /// The TLS files of the SSL listener `name`, if the certificate is
    /// configured.
    pub fn kafka_tls(&self, name: &str) -> Option<crate::tls::TlsFiles> {
        if self.ssl_cert_file.is_empty() {
            return None;
        }
        Some(crate::tls::TlsFiles {
            cert: self.ssl_cert_file.clone().into(),
            key: self.ssl_key_file.clone().into(),
            client_auth: self.client_auth_of(name).unwrap_or(crate::tls::ClientAuth::None),
            client_ca: (!self.ssl_ca_file.is_empty()).then(|| self.ssl_ca_file.clone().into()),
            alpn: Vec::new(),
        })
    }

    /// The REST bridge's settings (loads the TLS files when configured).
    pub fn rest(&self) -> anyhow::Result<crate::rest::RestConfig> {
        let tls = match self.rest_tls_cert_file.as_str() {
            "" => None,
            cert => Some(crate::rest::listener::tls_config(std::path::Path::new(cert), std::path::Path::new(&self.rest_tls_key_file))?),
        };
        Ok(crate::rest::RestConfig {
            max_body_bytes: self.rest_max_body_bytes,
            max_in_flight_bytes: self.rest_max_in_flight_bytes,
            rate_limit_per_sec: self.rest_rate_limit_per_sec,
            require_authentication: self.rest_require_authentication,
            body_timeout: std::time::Duration::from_millis(self.rest_body_timeout_ms),
            coalesce: self.rest_coalesce,
            routes: match self.rest_routes_file.as_str() {
                "" => Default::default(),
                path => crate::rest::routes::Routes::load(std::path::Path::new(path)).map_err(|e| anyhow::anyhow!("rest_routes_file: {e}"))?,
            },
            listener: crate::rest::listener::ListenerConfig {
                max_connections: self.rest_max_connections,
                max_header_bytes: self.rest_max_header_bytes,
                max_uri_bytes: self.rest_max_uri_bytes,
                idle_timeout: std::time::Duration::from_millis(self.rest_idle_timeout_ms),
                tls,
            },
        })
    }

    fn timestamp_type(&self) -> Option<TimestampType> {
        match self.message_timestamp_type.as_str() {
            "CreateTime" => Some(TimestampType::CreateTime),
            "LogAppendTime" => Some(TimestampType::LogAppendTime),
            _ => None,
        }
    }

    /// The topic defaults the operator set, under their Kafka broker
    /// names (the static layer of DescribeConfigs).
    fn static_topic_defaults(&self) -> std::collections::BTreeMap<String, String> {
        let all = [
            ("retention_ms", "log.retention.ms", self.retention_ms.to_string()),
            ("retention_bytes", "log.retention.bytes", self.retention_bytes.to_string()),
            ("message_max_bytes", "message.max.bytes", self.message_max_bytes.to_string()),
            ("message_timestamp_type", "log.message.timestamp.type", self.message_timestamp_type.clone()),
            ("message_timestamp_before_max_ms", "log.message.timestamp.before.max.ms", self.message_timestamp_before_max_ms.to_string()),
            ("message_timestamp_after_max_ms", "log.message.timestamp.after.max.ms", self.message_timestamp_after_max_ms.to_string()),
            ("segment_bytes", "log.segment.bytes", self.segment_bytes.to_string()),
            ("segment_ms", "log.roll.ms", self.segment_ms.to_string()),
            ("unclean_leader_election_enable", "unclean.leader.election.enable", self.unclean_leader_election_enable.to_string()),
        ];
        all.into_iter().filter(|(setting, _, _)| self.explicit.contains(setting)).map(|(_, key, value)| (key.to_owned(), value)).collect()
    }

    /// Cluster mode's settings, if `etcd_endpoints` names any.
    pub fn cluster(&self) -> Option<crate::cluster::ClusterConfig> {
        let endpoints: Vec<String> = self.etcd_endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
        (!endpoints.is_empty()).then(|| crate::cluster::ClusterConfig {
            etcd_endpoints: endpoints,
            cluster_name: self.cluster_name.clone(),
            session_timeout_ms: self.broker_session_timeout_ms,
            heartbeat_interval_ms: self.broker_heartbeat_interval_ms,
            offsets_replication_factor: self.offsets_topic_replication_factor,
            unclean_leader_election: self.unclean_leader_election_enable,
            auto_leader_rebalance: self.auto_leader_rebalance_enable,
            leader_imbalance_check_interval_ms: self.leader_imbalance_check_interval_ms,
            leader_imbalance_per_broker_percentage: self.leader_imbalance_per_broker_percentage,
        })
    }

    /// `broker_rack`, if set.
    pub fn rack(&self) -> Option<String> {
        (!self.broker_rack.is_empty()).then(|| self.broker_rack.clone())
    }

    pub fn engine(&self) -> EngineConfig {
        let mut e = EngineConfig::new(&self.data_dir);
        e.storage = StorageConfig {
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            tip: crate::storage::tip::TipConfig { bytes: self.tip_bytes, max_blocks: self.tip_index_blocks, lookup: self.tip_lookup.parse().expect("validated") },
            max_open_files: self.max_open_files(),
            hold_until_sync: self.flush.0 != FlushPolicy::Never,
            page_cache_bytes: u64::try_from(self.page_cache_bytes).unwrap_or(u64::MAX),
            ..StorageConfig::default()
        };
        e.flush = self.flush.0;
        e.probe = crate::engine::probe::EngineProbe::new(self.metrics_enabled);
        e.topic_defaults = TopicDefaults { statics: self.static_topic_defaults(), max_message_bytes_limit: self.max_message_bytes_limit() };
        e.auto_create_topics = self.auto_create_topics;
        e.num_partitions = self.num_partitions;
        e.default_replication_factor = self.default_replication_factor;
        e.max_topics = self.max_topics;
        e.write_queue = self.write_queue;
        e.producer_id_expiration_ms = self.producer_id_expiration_ms;
        e.max_inflated_batch_bytes = self.max_inflated_batch_bytes;
        e.validation_threads = self.validation_threads;
        e.max_auto_create_per_request = self.max_auto_create_per_request;
        e.auto_create_per_sec = self.auto_create_topics_per_sec;
        e.compaction = (self.compaction_lag_ms >= 0).then(|| {
            use crate::storage::subtree::split::{Budget, Strategy};
            let strategy = match self.compaction_split.parse().expect("validated") {
                Strategy::Adaptive(_) => Strategy::Adaptive(Budget {
                    max_stores: (self.compaction_max_stores > 0).then_some(self.compaction_max_stores),
                    min_store_bytes: self.compaction_min_store_bytes,
                }),
                s => s,
            };
            crate::storage::CompactConfig { lag_ms: self.compaction_lag_ms, strategy, max_bytes: self.compaction_max_window_bytes }
        });
        e.compaction_bytes_per_sec = self.compaction_bytes_per_sec;
        e.cleaning = crate::storage::CleanConfig { map_bytes: self.log_cleaner_dedupe_buffer_bytes };
        e.compaction_interval = Duration::from_millis(self.compaction_interval_ms);
        e
    }

    pub fn groups(&self) -> crate::kafka::coordinator::group::GroupConfig {
        crate::kafka::coordinator::group::GroupConfig {
            initial_rebalance_delay_ms: self.group_initial_rebalance_delay_ms,
            min_session_timeout_ms: self.group_min_session_timeout_ms,
            max_session_timeout_ms: self.group_max_session_timeout_ms,
            max_size: self.group_max_size,
            ..Default::default()
        }
    }

    pub fn consumer_groups(&self) -> crate::kafka::coordinator::consumer::ConsumerConfig {
        crate::kafka::coordinator::consumer::ConsumerConfig {
            session_timeout_ms: self.group_consumer_session_timeout_ms,
            heartbeat_interval_ms: self.group_consumer_heartbeat_interval_ms,
            max_size: self.group_consumer_max_size,
        }
    }

    pub fn transactions(&self) -> crate::kafka::coordinator::transactions::TxnConfig {
        crate::kafka::coordinator::transactions::TxnConfig {
            max_timeout_ms: self.transaction_max_timeout_ms,
            id_expiration_ms: self.transactional_id_expiration_ms,
            check_every: Duration::from_millis(self.transaction_timeout_check_ms),
        }
    }

    /// Files the descriptor cache keeps open: the setting, or half of what
    /// the descriptor limit leaves after every listener's connections and
    /// a reserve (at least 64).
    pub fn max_open_files(&self) -> usize {
        if self.max_open_files > 0 {
            return self.max_open_files;
        }
        let limit = crate::storage::files::nofile_limit().min(usize::MAX as u64) as usize;
        let connections = self.max_connections + self.rest_max_connections + self.admin_max_connections;
        (limit.saturating_sub(connections + 256) / 2).clamp(64, 1 << 20)
    }

    /// The largest max.message.bytes a topic may set: a batch is never
    /// larger than the request that carries it, nor than a segment.
    pub fn max_message_bytes_limit(&self) -> i32 {
        (self.max_request_bytes as u64).min(self.segment_bytes).min(i32::MAX as u64) as i32
    }

    pub fn max_fetch_wait(&self) -> Duration {
        Duration::from_millis(self.max_fetch_wait_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn layers_file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("canopy.toml");
        std::fs::write(&path, "num_partitions = 4\nflush = \"interval:10\"\ndata_dir = \"/tmp/x\"\n").unwrap();
        let cli = Cli::try_parse_from(["canopy", "--config", path.to_str().unwrap(), "--data-dir", "/tmp/y"]).unwrap();
        let c = Config::load(&cli.serve).unwrap();
        assert_eq!(c.num_partitions, 4);
        assert_eq!(c.flush.0, FlushPolicy::Interval(Duration::from_millis(10)));
        assert_eq!(c.data_dir, PathBuf::from("/tmp/y"));
        assert_eq!(c.kafka_listener, "127.0.0.1:9092".parse::<SocketAddr>().unwrap());
    }

    #[test]
    fn bad_values_name_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "num_partitions = 0\n").unwrap();
        let cli = Cli::try_parse_from(["canopy", "--config", path.to_str().unwrap()]).unwrap();
        assert!(Config::load(&cli.serve).unwrap_err().to_string().contains("num_partitions"));
        std::fs::write(&path, "no_such_key = 1\n").unwrap();
        assert!(Config::load(&cli.serve).unwrap_err().to_string().contains("no_such_key"));
        std::fs::write(&path, "flush = \"sometimes\"\n").unwrap();
        assert!(Config::load(&cli.serve).unwrap_err().to_string().contains("flush"));
        assert!(Cli::try_parse_from(["canopy", "--kafka-listener", "nowhere"]).is_err());
    }

    #[test]
    fn security_settings_are_checked_together() {
        let load = |flags: &[&str]| {
            let mut argv = vec!["canopy"];
            argv.extend_from_slice(flags);
            Config::load(&Cli::try_parse_from(argv).unwrap().serve)
        };
        let err = |flags: &[&str]| load(flags).unwrap_err().to_string();
        assert!(err(&["--listeners", "SSL://127.0.0.1:0"]).contains("ssl_cert_file"));
        let tls = ["--ssl-cert-file", "c.pem", "--ssl-key-file", "k.pem"];
        let with = |extra: &[&'static str]| [&["--listeners", "SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"][..], &tls[..], extra].concat();
        assert!(err(&with(&["--ssl-client-auth", "required"])).contains("ssl_ca_file"));
        assert!(err(&with(&["--ssl-client-auth", "sometimes"])).contains("ssl_client_auth"));
        assert!(err(&with(&["--listener-ssl-client-auth", "PLAINTEXT:required", "--ssl-ca-file", "ca.pem"])).contains("listener_ssl_client_auth"));
        assert!(err(&with(&["--sasl-enabled-mechanisms", "GSSAPI"])).contains("sasl_enabled_mechanisms"));
        assert!(err(&with(&["--super-users", "admin"])).contains("super_users"));
        assert!(err(&["--advertised-listeners", "PLAINTEXT://h:1"]).contains("listeners"));
        let c = load(&with(&["--listener-ssl-client-auth", "ssl:required", "--ssl-ca-file", "ca.pem", "--super-users", "User:admin; User:CN=ops,O=x"])).unwrap();
        assert_eq!(c.client_auth_of("SSL"), Ok(crate::tls::ClientAuth::Required));
        assert_eq!(c.client_auth_of("SASL_SSL"), Ok(crate::tls::ClientAuth::None));
        assert_eq!(c.super_user_list().unwrap().iter().map(|p| p.to_string()).collect::<Vec<_>>(), ["User:admin", "User:CN=ops,O=x"]);
        // Without `listeners`, the one plaintext listener of before.
        let c = load(&["--advertised-listener", "broker:19092"]).unwrap();
        let l = c.kafka_listeners().unwrap();
        assert_eq!((l.len(), l[0].name.as_str(), &l[0].advertised), (1, "PLAINTEXT", &Some(("broker".to_owned(), 19092))));
        assert_eq!(c.inter_broker(), Ok(crate::kafka::InterBroker { listener: "PLAINTEXT".into(), tls: None }));
    }

    #[test]
    fn brokers_reach_each_other_on_plaintext_or_on_tls_both_ways() {
        // Loaded in single-node mode (which checks only the name), then
        // asked as cluster mode would ask (`validate` asks the same).
        let ask = |map: &str, flags: &[&str]| {
            let mut argv = vec!["canopy", "--listeners", "CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0,SASL://127.0.0.1:0", "--listener-security-protocol-map", map];
            argv.extend_from_slice(&["--ssl-cert-file", "n.pem", "--ssl-key-file", "n.key", "--ssl-ca-file", "ca.pem"]);
            argv.extend_from_slice(flags);
            let mut c = Config::load(&Cli::try_parse_from(argv).unwrap().serve).map_err(|e| e.to_string())?;
            c.etcd_endpoints = "http://127.0.0.1:2379".into();
            c.inter_broker()
        };
        let (plain, ssl) = ("CLIENT:PLAINTEXT,BROKER:PLAINTEXT,SASL:SASL_SSL", "CLIENT:PLAINTEXT,BROKER:SSL,SASL:SASL_SSL");
        // The first listener unless named; a name that is no listener, SASL,
        // and SSL that does not check the follower's certificate are refused.
        assert_eq!(ask(plain, &[]), Ok(crate::kafka::InterBroker { listener: "CLIENT".into(), tls: None }));
        assert_eq!(ask(plain, &["--inter-broker-listener-name", "broker"]), Ok(crate::kafka::InterBroker { listener: "BROKER".into(), tls: None }));
        assert!(ask(plain, &["--inter-broker-listener-name", "ELSEWHERE"]).unwrap_err().contains("not one of the listeners"));
        assert!(ask(plain, &["--inter-broker-listener-name", "SASL"]).unwrap_err().contains("SASL between brokers is not supported"));
        assert!(ask(ssl, &["--inter-broker-listener-name", "BROKER"]).unwrap_err().contains("must require client certificates"));
        let files = crate::tls::PeerFiles { cert: "n.pem".into(), key: "n.key".into(), ca: "ca.pem".into() };
        let both_ways = ask(ssl, &["--inter-broker-listener-name", "BROKER", "--listener-ssl-client-auth", "BROKER:required"]);
        assert_eq!(both_ways, Ok(crate::kafka::InterBroker { listener: "BROKER".into(), tls: Some(files) }));
    }
}
