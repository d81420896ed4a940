//! The Kafka listener: connections, request dispatch, one file per API.
//!
//! Async (tokio). Talks to storage only through the engine. See `conn.rs`
//! for framing, pipelining and the per-connection in-flight bound, and
//! `handlers/mod.rs` for how version ranges are declared and ApiVersions is
//! derived from them.

pub mod authz;
pub mod conn;
pub mod coordinator;
pub mod errors;
pub mod features;
pub mod fetch_session;
pub mod handlers;
pub mod listener;
pub mod session;
pub mod probe;
pub mod replication;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::engine::Engine;

/// A broker as Metadata, DescribeCluster and FindCoordinator give it: its
/// address on the listener the request came in on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Host and port put in Metadata and FindCoordinator answers.
    pub advertised_host: String,
    pub advertised_port: i32,
    pub max_request_bytes: usize,
    pub max_in_flight_per_connection: usize,
    pub max_connections: usize,
    /// Upper bound on a Fetch's `max_wait_ms`.
    pub max_fetch_wait: Duration,
    /// Upper bound on a Fetch's `max_bytes` and `partition_max_bytes`.
    pub fetch_max_bytes: usize,
    /// Connections from one address at once.
    pub max_connections_per_ip: usize,
    /// A connection with nothing in flight that sends nothing this long is
    /// closed.
    pub connections_max_idle: Duration,
    /// A response not taken by the client within this closes the connection.
    pub response_write_timeout: Duration,
    /// How long shutdown waits for connections to finish their requests.
    pub shutdown_timeout: Duration,
    /// A SASL session lasts this long, then must re-authenticate (0: for
    /// ever).
    pub connections_max_reauth_ms: i64,
    /// A failed authentication is answered this much later.
    pub failed_authentication_delay: Duration,
    /// Largest frame before authentication on a SASL listener.
    pub sasl_max_receive_bytes: usize,
    /// The feature levels ApiVersions reports.
    pub features: features::Features,
    pub inter_broker: InterBroker,
}

/// How brokers reach each other (cluster mode; `Config::inter_broker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterBroker {
    /// The listener followers fetch from, and the only one that takes a
    /// replica's fetch.
    pub listener: String,
    /// Set when that listener is SSL: what a follower presents and checks.
    pub tls: Option<crate::tls::PeerFiles>,
}

/// What every handler can reach.
pub struct Broker {
    /// The cluster's nodes and controller, and this node's id (single-node
    /// mode: this node alone).
    pub cluster: Arc<crate::cluster::Membership>,
    pub engine: Arc<Engine>,
    pub coordinator: coordinator::Coordinator,
    pub transactions: coordinator::transactions::Transactions,
    pub cfg: KafkaConfig,
    /// Turns true when the broker shuts down: parked fetches answer at once.
    pub stopping: watch::Receiver<bool>,
    /// Where requests, errors and connections are counted.
    pub probe: Arc<probe::KafkaProbe>,
    /// Request bytes in memory, broker-wide (shared with the REST bridge).
    pub budget: Arc<crate::limits::MemoryBudget>,
    /// Connections per source address.
    pub per_ip: Arc<crate::limits::PerIp>,
    /// SCRAM credentials: what SASL checks passwords against.
    pub users: Arc<crate::auth::users::UserStore>,
    /// ACLs, and whether requests are checked against them.
    pub authorizer: Arc<crate::auth::acl::Authorizer>,
    /// Client quotas: byte rates and request time per user and client id.
    pub quotas: Arc<crate::auth::quota::Quotas>,
    /// OAUTHBEARER's token validator, when a JWKS is configured.
    pub oauth: Option<Arc<crate::auth::oauth::Validator>>,
    /// Fetch sessions (KIP-227), shared by every connection.
    pub fetch_sessions: Arc<fetch_session::FetchSessions>,
    /// Replication between brokers (cluster mode).
    pub replication: Arc<replication::Replication>,
    /// Cluster mode: links to other nodes for requests this node makes of
    /// them (forwarded REST records, transaction markers, a transaction's
    /// partitions asked at its coordinator); set once the broker exists.
    pub peers: std::sync::OnceLock<Arc<replication::peers::Forwarder>>,
}

impl Broker {
    /// This broker's node id.
    pub fn node_id(&self) -> i32 {
        self.cluster.node_id()
    }

    /// Every live broker in `view`, with its address on the running
    /// request's listener (outside a request: its first listener). As in
    /// Kafka, a broker without that listener is left out. This broker is
    /// always listed, with the listener's own advertised address, also
    /// while its registration is being renewed: it names itself as a
    /// leader, and clients must be able to reach what they are told.
    pub fn brokers_in(&self, view: &crate::cluster::ClusterView) -> Vec<BrokerAddr> {
        let listener = conn::listener_name();
        let me = self.node_id();
        let (host, port) = conn::advertised(self);
        let mut out = vec![BrokerAddr { id: me, host, port, rack: self.cluster.rack().map(str::to_owned) }];
        out.extend(view.nodes.values().filter(|n| n.id != me).filter_map(|n| {
            let e = match &listener {
                Some(l) => n.endpoint(l)?,
                None => n.endpoints.first()?,
            };
            Some(BrokerAddr { id: n.id, host: e.host.clone(), port: e.port, rack: n.rack.clone() })
        }));
        out.sort_by_key(|b| b.id);
        out
    }
}

/// Where a partition's leader is, for a request this node may not serve:
/// NOT_LEADER_OR_FOLLOWER's hints (KIP-951). `leader` is -1 while the
/// partition has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotLeader {
    pub leader: i32,
    pub leader_epoch: i32,
}

impl Broker {
    /// Whether this node leads `topic`'s partition `partition` now
    /// ([`crate::cluster::Membership::lead`]); `Err`: where the leader is.
    pub fn lead(&self, view: &crate::cluster::ClusterView, topic: &str, partition: i32) -> Result<i32, NotLeader> {
        self.cluster.lead(view, topic, partition).map_err(|(leader, leader_epoch)| NotLeader { leader, leader_epoch })
    }
}

impl Broker {
    /// Whether this node serves the subtree stream `s` now. Always in
    /// single-node mode; in cluster mode only the node leading every unit
    /// the stream covers does ([`crate::cluster::ClusterView::stream_server`]).
    /// `Err(Some(node))`: that node serves it (NOT_LEADER_OR_FOLLOWER);
    /// `Err(None)`: no node can (its topics are led by several).
    pub fn serve_stream(&self, view: &crate::cluster::ClusterView, s: &crate::engine::subtree::Subtree) -> Result<(), Option<i32>> {
        if view.single {
            return Ok(());
        }
        match stream_server(&self.engine, view, self.node_id(), s) {
            Some(n) if n == self.node_id() && self.cluster.in_good_standing() => Ok(()),
            // Past its lease this node may have been replaced: no leader
            // known (as `lead`).
            Some(n) if n == self.node_id() => Err(Some(-1)),
            other => Err(other),
        }
    }
}

impl Broker {
    /// Whether this node coordinates the group or transactional id `key`
    /// now (always in single-node mode): see [`Broker::coordinator_error`].
    pub fn coordinates(&self, key: &str) -> bool {
        self.coordinator_error(key).is_none()
    }

    /// Why this node does not answer for the group or transactional id
    /// `key` now: NOT_COORDINATOR when another node coordinates it (the
    /// client looks its coordinator up again), COORDINATOR_LOAD_IN_PROGRESS
    /// while this node, its coordinator, has not loaded the key's shard in
    /// its current leader epoch (cluster mode, `coordinator::journal`; the
    /// client retries here), as Kafka's coordinators answer.
    pub fn coordinator_error(&self, key: &str) -> Option<i16> {
        use kafka_protocol::ResponseError as E;
        if self.cluster.coordinator(key) != Some(self.node_id()) || !self.cluster.in_good_standing() {
            Some(E::NotCoordinator.code())
        } else if !self.coordinator.ready(key) {
            Some(E::CoordinatorLoadInProgress.code())
        } else {
            None
        }
    }
}

/// The node serving the subtree stream `s` as `view` says (cluster mode;
/// `me` is the node asking): see [`crate::cluster::ClusterView::stream_server`].
pub fn stream_server(engine: &Engine, view: &crate::cluster::ClusterView, me: i32, s: &crate::engine::subtree::Subtree) -> Option<i32> {
    if view.single {
        return Some(me);
    }
    let units: std::collections::BTreeSet<String> = engine.subtree_topics(s).iter().flat_map(|t| (0..t.partitions()).map(|p| crate::cluster::topics::unit_of(t.name(), p))).collect();
    view.stream_server(me, &units)
}

/// The error for a subtree stream this node does not serve
/// ([`Broker::serve_stream`]): NOT_LEADER_OR_FOLLOWER when a node serves
/// it, UNKNOWN_TOPIC_OR_PARTITION when none can.
pub fn stream_refusal(server: Option<i32>) -> i16 {
    use kafka_protocol::ResponseError as E;
    match server {
        Some(_) => E::NotLeaderOrFollower.code(),
        None => E::UnknownTopicOrPartition.code(),
    }
}

/// KIP-320: a request naming the leader epoch it knows (`asked`; -1:
/// none) is refused when it is not the leader's: FENCED_LEADER_EPOCH when
/// older (the client refreshes its metadata), UNKNOWN_LEADER_EPOCH when
/// newer (this node has not seen it yet).
pub fn epoch_error(asked: i32, mine: i32) -> Option<i16> {
    use kafka_protocol::ResponseError as E;
    match asked {
        a if a < 0 || a == mine => None,
        a if a < mine => Some(E::FencedLeaderEpoch.code()),
        _ => Some(E::UnknownLeaderEpoch.code()),
    }
}

/// A producer id never handed out before (InitProducerId, and new
/// transactional ids): from this node's block of the cluster's ids in
/// cluster mode, else from the catalog, durably. The error is the code to
/// answer.
pub async fn allocate_producer_id(engine: &Arc<Engine>, cluster: &crate::cluster::Membership) -> Result<i64, i16> {
    use kafka_protocol::ResponseError as E;
    if let Some(got) = cluster.allocate_producer_id().await {
        // Kafka's answer while its next block has not arrived: retriable.
        return got.map_err(|why| {
            tracing::warn!(%why, "allocating a producer id failed");
            E::CoordinatorLoadInProgress.code()
        });
    }
    let engine = engine.clone();
    match tokio::task::spawn_blocking(move || engine.catalog().allocate_producer_id()).await {
        Ok(Ok(id)) => Ok(id),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "allocating a producer id failed");
            Err(E::KafkaStorageError.code())
        }
        Err(_) => Err(E::CoordinatorNotAvailable.code()),
    }
}

/// Accepts connections on `listener` until `shutdown` turns true, then
/// waits for open connections to finish their in-flight requests, at most
/// `shutdown_timeout`; the rest are dropped. `limit` is shared by every
/// listener (`max_connections` is broker-wide).
pub async fn serve(listener: TcpListener, spec: Arc<listener::Listener>, broker: Arc<Broker>, limit: Arc<Semaphore>, mut shutdown: watch::Receiver<bool>) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut backoff = Duration::from_millis(5);
    loop {
        // The permit is taken before accept(): at the limit, new connections
        // wait in the kernel backlog instead of being accepted and dropped.
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = shutdown.changed() => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(5);
                // Over the per-address limit: closed at once, as Kafka does.
                let Some(slot) = broker.per_ip.admit(peer.ip()) else {
                    tracing::debug!(%peer, limit = broker.per_ip.max(), "refusing a connection over max_connections_per_ip");
                    broker.probe.closed(probe::Closed::PerIp);
                    drop(stream);
                    continue;
                };
                let broker = broker.clone();
                let shutdown = shutdown.clone();
                let probe = broker.probe.clone();
                let spec = spec.clone();
                tasks.spawn(async move {
                    let open = probe.connections.opened();
                    if let Err(e) = conn::run(stream, peer, broker, spec, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection closed with error");
                    }
                    drop(open);
                    drop(slot);
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; backing off");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let open = tasks.len();
    let drained = tokio::time::timeout(broker.cfg.shutdown_timeout, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(open, left = tasks.len(), timeout_ms = broker.cfg.shutdown_timeout.as_millis() as u64, "Kafka connections still open at the shutdown timeout; dropping them");
        tasks.shutdown().await;
    }
}
