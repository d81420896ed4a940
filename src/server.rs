//! Composition root: opens the engine, binds the listeners, schedules
//! background work, and shuts everything down in order.
//!
//! Shutdown: stop accepting and stop reading new requests (in cluster mode
//! the etcd lease is revoked at the same time: the others see this node
//! go); let every connection finish its in-flight requests; drain the
//! writer, sync, write the clean-shutdown marker.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::rest;
use crate::engine::{system_clock, Clock, Engine};
use crate::kafka::coordinator::transactions::Transactions;
use crate::kafka::coordinator::Coordinator;
use crate::kafka::{self, Broker, KafkaConfig};
use crate::metrics::{self, Health};

/// How long a clean stop waits for its leadership to move (Kafka's
/// controlled.shutdown, bounded: with no other in-sync replica, or etcd
/// out of reach, the node stops anyway and the controller elects after).
const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Running {
    /// The first Kafka listener's address.
    pub kafka_addr: SocketAddr,
    /// Every Kafka listener: its name and bound address.
    pub kafka_listeners: Vec<(String, SocketAddr)>,
    pub admin_addr: SocketAddr,
    /// The REST bridge's address, if it listens.
    pub rest_addr: Option<SocketAddr>,
    pub engine: Arc<Engine>,
    health: Arc<Health>,
    stop: watch::Sender<bool>,
    kafka: JoinHandle<()>,
    admin: JoinHandle<()>,
    rest: Option<JoinHandle<()>>,
    background: JoinHandle<()>,
    compactor: JoinHandle<()>,
    expiry: JoinHandle<()>,
    /// Cluster mode's etcd session (it revokes the lease when it ends),
    /// and this node's membership (to hand its leadership over first).
    cluster: Option<(JoinHandle<()>, Arc<crate::cluster::Membership>)>,
}

pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    start_with_clock(cfg, system_clock()).await
}

pub async fn start_with_clock(cfg: Config, clock: Clock) -> anyhow::Result<Running> {
    // A broker holds a descriptor per connection and per open file: take
    // all the process may have.
    match crate::storage::files::raise_nofile_limit() {
        Ok((before, now, hard)) => tracing::info!(soft_before = before, soft = now, hard, max_open_files = cfg.max_open_files(), "descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the descriptor limit"),
    }
    // The admin listener first: /health answers and /ready says "not
    // ready" while storage recovers.
    let admin_listener = TcpListener::bind(cfg.admin_listener).await.with_context(|| format!("binding admin_listener {}", cfg.admin_listener))?;
    let admin_addr = admin_listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let health = Arc::new(Health::default());
    let metrics_slot: metrics::MetricsSlot = Default::default();
    // The admin listener has limits of its own: a crowd of scrapers or idle
    // connections cannot hold it (or the broker's descriptors).
    let admin_cfg = rest::listener::ListenerConfig { max_connections: cfg.admin_max_connections, idle_timeout: Duration::from_secs(10), ..Default::default() };
    let admin = tokio::spawn(rest::listener::serve(admin_listener, metrics::router(health.clone(), metrics_slot.clone()), admin_cfg, Arc::new(crate::probe::ConnectionStats::default()), stop_rx.clone()));
    match open(cfg, clock, stop, stop_rx, health, metrics_slot, admin_addr, admin).await {
        Ok(r) => Ok(r),
        Err((e, stop, admin)) => {
            let _ = stop.send(true);
            let _ = admin.await;
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn open(
    cfg: Config,
    clock: Clock,
    stop: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    health: Arc<Health>,
    metrics_slot: metrics::MetricsSlot,
    admin_addr: SocketAddr,
    admin: JoinHandle<()>,
) -> Result<Running, (anyhow::Error, watch::Sender<bool>, JoinHandle<()>)> {
    match serve_all(&cfg, clock, stop_rx, &health, &metrics_slot).await {
        Ok(parts) => {
            health.ready.store(true, Ordering::Release);
            tracing::info!(kafka_addr = %parts.kafka_addr, %admin_addr, rest_addr = ?parts.rest_addr, data_dir = %cfg.data_dir.display(), "canopy is serving");
            Ok(parts.finish(admin_addr, health, stop, admin))
        }
        Err(e) => Err((e, stop, admin)),
    }
}

/// What `serve_all` started, before it is a `Running`.
struct Started {
    kafka_addr: SocketAddr,
    kafka_listeners: Vec<(String, SocketAddr)>,
    rest_addr: Option<SocketAddr>,
    engine: Arc<Engine>,
    kafka: JoinHandle<()>,
    rest: Option<JoinHandle<()>>,
    background: JoinHandle<()>,
    compactor: JoinHandle<()>,
    expiry: JoinHandle<()>,
    cluster: Option<(JoinHandle<()>, Arc<crate::cluster::Membership>)>,
}

impl Started {
    fn finish(self, admin_addr: SocketAddr, health: Arc<Health>, stop: watch::Sender<bool>, admin: JoinHandle<()>) -> Running {
        let Started { kafka_addr, kafka_listeners, rest_addr, engine, kafka, rest, background, compactor, expiry, cluster } = self;
        Running { kafka_addr, kafka_listeners, admin_addr, rest_addr, engine, health, stop, kafka, admin, rest, background, compactor, expiry, cluster }
    }
}

async fn serve_all(cfg: &Config, clock: Clock, stop_rx: watch::Receiver<bool>, health: &Arc<Health>, metrics_slot: &std::sync::OnceLock<Arc<metrics::Metrics>>) -> anyhow::Result<Started> {
    let engine_cfg = cfg.engine();
    let engine_probe = engine_cfg.probe.clone();
    let engine_clock = clock.clone();
    tracing::info!(data_dir = %cfg.data_dir.display(), "recovering storage");
    let engine = tokio::task::spawn_blocking(move || Engine::open(engine_cfg, engine_clock)).await?.context("opening the data directory")?;

    let specs = cfg.kafka_listeners().map_err(|e| anyhow::anyhow!("listeners: {e}"))?;
    let mut bound = Vec::new();
    for spec in specs {
        let l = TcpListener::bind(&spec.bind).await.with_context(|| format!("binding listener {} on {}", spec.name, spec.bind))?;
        let addr = l.local_addr()?;
        bound.push((spec, l, addr));
    }
    let kafka_addr = bound[0].2;
    let rest_listener = match cfg.rest_listener.as_str() {
        "" => None,
        addr => Some(TcpListener::bind(addr).await.with_context(|| format!("binding rest_listener {addr}"))?),
    };
    let rest_addr = rest_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    let rest_cfg = cfg.rest().context("the REST listener's settings")?;
    let principals = Arc::new(match cfg.principals_file.as_str() {
        "" => crate::auth::Principals::default(),
        path => crate::auth::Principals::load(std::path::Path::new(path)).map_err(|e| anyhow::anyhow!("principals_file: {e}"))?,
    });
    // One TLS configuration per listener that has TLS (they differ in
    // whether they ask for client certificates).
    let mut tls = std::collections::HashMap::new();
    for (spec, _, _) in bound.iter().filter(|(s, _, _)| s.protocol.tls()) {
        let files = cfg.kafka_tls(&spec.name).context("a TLS listener needs ssl_cert_file")?;
        tls.insert(spec.name.clone(), crate::tls::Reloading::load(files).with_context(|| format!("the TLS files of listener {}", spec.name))?);
    }
    let mechanisms = cfg.sasl_mechanisms().map_err(|e| anyhow::anyhow!("sasl_enabled_mechanisms: {e}"))?;
    let mapping = Arc::new(crate::auth::mapping::PrincipalMapper::parse(&cfg.ssl_principal_mapping_rules).map_err(|e| anyhow::anyhow!("ssl_principal_mapping_rules: {e}"))?);
    let listeners: Vec<(Arc<kafka::listener::Listener>, TcpListener, SocketAddr)> = bound
        .into_iter()
        .map(|(spec, l, addr)| {
            let (advertised_host, advertised_port) = spec.advertised.clone().unwrap_or_else(|| (addr.ip().to_string(), addr.port() as i32));
            // An advertised port of 0 (a test binding port 0) is the bound one.
            let advertised_port = if advertised_port == 0 { addr.port() as i32 } else { advertised_port };
            let listener = kafka::listener::Listener {
                tls: tls.get(&spec.name).cloned(),
                mechanisms: if spec.protocol.sasl() { mechanisms.clone() } else { Vec::new() },
                principal_mapping: mapping.clone(),
                name: spec.name,
                protocol: spec.protocol,
                advertised_host,
                advertised_port,
            };
            (Arc::new(listener), l, addr)
        })
        .collect();
    let first = &listeners[0].0;
    // This node as the cluster sees it: every listener's advertised address.
    let me = crate::cluster::NodeRecord {
        id: cfg.node_id,
        rack: cfg.rack(),
        incarnation: 0,
        endpoints: listeners.iter().map(|(l, _, _)| crate::cluster::Endpoint { listener: l.name.clone(), host: l.advertised_host.clone(), port: l.advertised_port }).collect(),
    };
    let (membership, cluster) = join_cluster(cfg, &engine, me, stop_rx.clone()).await?;
    let broker = broker(cfg, engine.clone(), (first.advertised_host.clone(), first.advertised_port), Some(membership), clock, stop_rx.clone()).await?;
    let cluster = match cluster {
        None => None,
        Some((task, stores)) => {
            // ACLs and users are the cluster's (etcd's) from now on, before
            // any request; users set in this node's catalog go there first.
            let (local, directory, catalog_engine) = (broker.users.all(), stores.users.clone(), engine.clone());
            let handed = tokio::task::spawn_blocking(move || crate::cluster::hand_over_users(local, directory.as_ref(), catalog_engine.catalog())).await?;
            match handed {
                Ok(0) => {}
                Ok(n) => tracing::info!(users = n, "SCRAM users of this node's data directory handed to the cluster"),
                Err(e) => anyhow::bail!("handing this node's SCRAM users to the cluster: {e}"),
            }
            // ACLs and quotas in the catalog (a build before they lived in
            // etcd) are not used: said loudly, since missing ACLs change
            // what is allowed.
            let (acls, quotas) = (engine.catalog().acls().map(|a| a.len()).unwrap_or(0), engine.catalog().quotas().map(|q| q.len()).unwrap_or(0));
            if acls + quotas > 0 {
                tracing::error!(acls, quotas, "this node's catalog holds ACLs or client quotas, which cluster mode does not use (the cluster's live in etcd): create them again through any broker");
            }
            if !cfg.authorizer_enabled {
                tracing::warn!(listener = %broker.cfg.inter_broker.listener, "without the authorizer, whoever reaches the inter-broker listener can fetch as a replica and move high watermarks: keep it on a private network, or SSL with a CA only brokers hold certificates of");
            }
            crate::cluster::follow_security(&broker.authorizer, &broker.users, &broker.quotas, stores, &broker.cluster, stop_rx.clone());
            Some(task)
        }
    };
    if cluster.is_some() {
        // Ends with the broker (at `stop_rx`); its fetchers with it.
        kafka::replication::Replication::start(broker.clone(), stop_rx.clone());
        // Before any request: committed offsets go to the shards' logs.
        kafka::replication::coordinators::ShardLogs::start(broker.clone(), stop_rx.clone());
    }
    let (budget, per_ip, coordinator) = (broker.budget.clone(), broker.per_ip.clone(), broker.coordinator.clone());
    let kafka_probe = broker.probe.clone();
    let kafka_listeners: Vec<(String, SocketAddr)> = listeners.iter().map(|(l, _, a)| (l.name.clone(), *a)).collect();
    let limit = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections));
    let mut serving = Vec::new();
    for (spec, l, addr) in listeners {
        tracing::info!(listener = %spec.name, protocol = spec.protocol.name(), %addr, advertised = %format!("{}:{}", spec.advertised_host, spec.advertised_port), "Kafka listener");
        serving.push(tokio::spawn(kafka::serve(l, spec, broker.clone(), limit.clone(), stop_rx.clone())));
    }
    let reload_every = Duration::from_millis(cfg.ssl_reload_check_ms);
    serving.push(tokio::spawn(crate::tls::watch(tls.into_values().collect(), reload_every, stop_rx.clone())));
    let kafka = tokio::spawn(async move {
        for s in serving {
            let _ = s.await;
        }
    });
    // Cluster mode: one set of links to the other nodes, for the REST
    // bridge's forwarded records and the transaction coordinator's markers.
    let peers = cfg.cluster().is_some().then(|| {
        let peers = Arc::new(crate::kafka::replication::peers::Forwarder::new(&broker));
        let _ = broker.peers.set(peers.clone());
        broker.transactions.set_peers(peers.clone());
        peers
    });
    let (authorizer, quotas, users) = (broker.authorizer.clone(), broker.quotas.clone(), broker.users.clone());
    let cluster_id = broker.cluster.view().cluster_id.clone();
    let bridge = rest_listener.as_ref().map(|_| {
        let probe = Arc::new(rest::probe::RestProbe::new(cfg.metrics_enabled));
        Arc::new(rest::Bridge::new(engine.clone(), rest_cfg, principals.clone(), probe, budget.clone()).with_authorizer(authorizer).with_quotas(quotas).with_users(users).with_cluster_id(cluster_id.clone()).map_cluster(cfg.cluster().is_some().then(|| broker.cluster.clone()), peers.clone()))
    });
    let rest = rest_listener.zip(bridge.clone()).map(|(l, bridge)| tokio::spawn(rest::serve(l, bridge, stop_rx.clone())));
    let limits = metrics::Limits { budget: budget.clone(), per_ip, max_connections: cfg.max_connections, max_topics: cfg.max_topics, fetch_sessions: broker.fetch_sessions.clone(), fetch_session_slots: cfg.max_incremental_fetch_session_cache_slots, fetch_session_partitions: cfg.max_incremental_fetch_session_cache_partitions };
    let mut m = metrics::Metrics::new(engine.clone(), &engine_probe, kafka_probe, bridge, health.clone(), limits, cfg.metrics_topic_label_limit);
    if cluster.is_some() {
        m = m.with_replication(broker.replication.clone());
    }
    let _ = metrics_slot.set(Arc::new(m));
    let background = tokio::spawn(retention_loop(engine.clone(), Duration::from_millis(cfg.retention_check_interval_ms), stop_rx.clone()));
    let compactor = tokio::spawn(compaction_loop(engine.clone(), Duration::from_millis(cfg.compaction_interval_ms), stop_rx.clone()));
    let expiry = tokio::spawn(offset_expiry_loop(coordinator, cfg.offsets_retention_minutes * 60_000, stop_rx));
    let cluster = cluster.map(|session| (session, broker.cluster.clone()));
    Ok(Started { kafka_addr, kafka_listeners, rest_addr, engine, kafka, rest, background, compactor, expiry, cluster })
}

/// Single-node mode: a cluster of `me` alone. Cluster mode: `me`
/// registered in etcd, and the session's task.
/// A cluster node's session task and where its ACLs and users live.
type Joined = (JoinHandle<()>, crate::cluster::SecurityStores);

async fn join_cluster(cfg: &Config, engine: &Arc<Engine>, me: crate::cluster::NodeRecord, stop_rx: watch::Receiver<bool>) -> anyhow::Result<(Arc<crate::cluster::Membership>, Option<Joined>)> {
    let Some(cluster) = cfg.cluster() else {
        if let Some(id) = engine.catalog().member_of()? {
            anyhow::bail!("the data directory belongs to cluster {id} (cluster mode): start it with that cluster's etcd_endpoints, or use another data directory for single-node mode");
        }
        return Ok((Arc::new(crate::cluster::Membership::single(engine.cluster_id().to_owned(), me)), None));
    };
    if let Some(e) = me.endpoints.iter().find(|e| e.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified())) {
        anyhow::bail!("listener {} would advertise {} to the other brokers' clients: set advertised_listeners to an address they can reach", e.listener, e.host);
    }
    tracing::warn!("cluster mode is incomplete (issue 24): transaction state lives on its coordinator only, a transaction may span only partitions its coordinator leads");
    if cfg.authorizer_enabled {
        tracing::info!(listener = %cfg.inter_broker().map(|i| i.listener).unwrap_or_default(), "followers' fetches need CLUSTER_ACTION on the cluster for the principal they connect as on the inter-broker listener (make node principals super_users)");
    }
    #[cfg(feature = "cluster")]
    {
        let catalog_engine = engine.clone();
        let reserve: crate::cluster::etcd::Reserve = Arc::new(move |below| catalog_engine.catalog().reserve_producer_ids_below(below).map_err(|e| e.to_string()));
        let endpoints = cluster.etcd_endpoints.clone();
        let session = crate::cluster::etcd::join(cluster, me, engine.catalog().producer_ids_below(), reserve, stop_rx.clone()).await.context("joining the cluster")?;
        // A data directory belongs to one cluster (as Kafka's
        // meta.properties): another cluster's topics, or single-node
        // mode's, must not be taken for this cluster's.
        let cluster_id = session.membership.view().cluster_id.clone();
        match engine.catalog().member_of()? {
            Some(id) if id != cluster_id => anyhow::bail!("the data directory belongs to cluster {id}, but etcd at {endpoints:?} holds cluster {cluster_id}"),
            Some(_) => {}
            None if !engine.topics().is_empty() => anyhow::bail!("the data directory holds single-node mode's topics; a cluster node starts from an empty data directory (or one its cluster used)"),
            None => engine.catalog().set_member_of(&cluster_id)?,
        }
        // Topics are the cluster's from now on: changes go to etcd first,
        // and this node follows what etcd holds, once before serving.
        engine.set_directory(Arc::new(crate::cluster::etcd::Directory::new(&session, tokio::runtime::Handle::current())));
        // The view is read under the engine's admin lock (see follow_topics).
        let follow = |engine: Arc<Engine>, membership: Arc<crate::cluster::Membership>| async move {
            let read = move || {
                let view = membership.view();
                (crate::cluster::topics::topic_records(&view), (*view.damaged_topics).clone())
            };
            tokio::task::spawn_blocking(move || engine.follow_topics(read)).await.unwrap_or(0)
        };
        // The cluster-wide broker configs (topic defaults) likewise.
        let follow_configs = |engine: Arc<Engine>, membership: Arc<crate::cluster::Membership>| async move {
            let read = move || (*membership.view().broker_configs).clone();
            tokio::task::spawn_blocking(move || engine.follow_cluster_configs(read)).await.unwrap_or(false)
        };
        follow_configs(engine.clone(), session.membership.clone()).await;
        let first = session.membership.view();
        let changed = follow(engine.clone(), session.membership.clone()).await;
        tracing::info!(topics = first.topics.len(), changed, "following the cluster's topics");
        // Producer ids other nodes hand out are real here too: Produce
        // refuses ids below no block. Raised once before serving, then at
        // every view.
        engine.catalog().raise_producer_ids_below(first.producer_ids_end);
        let (mut views, engine, membership) = (session.membership.subscribe(), engine.clone(), session.membership.clone());
        let mut stop = stop_rx;
        tokio::spawn(async move {
            let (mut topics, mut damaged, mut configs) = (first.topics.clone(), first.damaged_topics.clone(), first.broker_configs.clone());
            loop {
                tokio::select! {
                    changed = views.changed() => if changed.is_err() { return },
                    _ = stop.changed() => return,
                }
                let view = views.borrow_and_update().clone();
                engine.catalog().raise_producer_ids_below(view.producer_ids_end);
                if !Arc::ptr_eq(&configs, &view.broker_configs) {
                    configs = view.broker_configs.clone();
                    follow_configs(engine.clone(), membership.clone()).await;
                }
                if !Arc::ptr_eq(&topics, &view.topics) || !Arc::ptr_eq(&damaged, &view.damaged_topics) {
                    damaged = view.damaged_topics.clone();
                    topics = view.topics.clone();
                    follow(engine.clone(), membership.clone()).await;
                }
            }
        });
        let directory = Arc::new(crate::cluster::etcd::Directory::new(&session, tokio::runtime::Handle::current()));
        let stores = crate::cluster::SecurityStores { acls: directory.clone(), users: directory.clone(), quotas: directory };
        Ok((session.membership, Some((session.task, stores))))
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = (cluster, stop_rx, engine);
        anyhow::bail!("etcd_endpoints is set, but this binary was built without cluster mode")
    }
}

/// The Kafka side of a broker over an open engine: the group and
/// transaction coordinators (started), the limits, and the listener's
/// settings, advertising `advertised` (host, port). The fuzz target
/// drives requests through one of these without a socket.
/// `cluster` is the node's membership; `None`: a cluster of this node
/// alone, advertising `advertised` on a PLAINTEXT listener.
pub async fn broker(cfg: &Config, engine: Arc<Engine>, advertised: (String, i32), cluster: Option<Arc<crate::cluster::Membership>>, clock: Clock, stop_rx: watch::Receiver<bool>) -> anyhow::Result<Arc<Broker>> {
    let cluster = cluster.unwrap_or_else(|| {
        let endpoint = crate::cluster::Endpoint { listener: "PLAINTEXT".into(), host: advertised.0.clone(), port: advertised.1 };
        Arc::new(crate::cluster::Membership::single(engine.cluster_id().to_owned(), crate::cluster::NodeRecord { id: cfg.node_id, rack: cfg.rack(), incarnation: 0, endpoints: vec![endpoint] }))
    });
    let users = Arc::new(crate::auth::users::UserStore::load(engine.catalog()).context("loading SCRAM credentials")?);
    let super_users = cfg.super_user_list().map_err(|e| anyhow::anyhow!("super_users: {e}"))?;
    let authorizer = Arc::new(crate::auth::acl::Authorizer::load(engine.catalog(), cfg.authorizer_enabled, super_users, cfg.allow_everyone_if_no_acl_found).context("loading ACLs")?);
    let quotas = Arc::new(crate::auth::quota::Quotas::load(engine.catalog()).context("loading client quotas")?);
    let oauth = match cfg.oauth() {
        Some(o) => Some(Arc::new(crate::auth::oauth::Validator::load(o).map_err(|e| anyhow::anyhow!("sasl_oauthbearer_jwks_file: {e}"))?)),
        None => None,
    };
    let coordinator = Coordinator::start(engine.clone(), cfg.groups(), cfg.consumer_groups(), clock.clone(), stop_rx.clone());
    if !cluster.view().single {
        // Until the shards' journal is set (once the broker exists), no
        // change to committed offsets may reach the catalog alone: the
        // recovery of transactions below must not write offsets a later
        // shard load would drop.
        coordinator.await_journal();
    }
    let transactions = Transactions::start(engine.clone(), cluster.clone(), coordinator.clone(), cfg.transactions(), clock, stop_rx.clone()).await.context("recovering transactions")?;
    Ok(Arc::new(Broker {
        cluster,
        coordinator,
        transactions,
        stopping: stop_rx,
        probe: Arc::new(kafka::probe::KafkaProbe::new(cfg.metrics_enabled)),
        engine,
        cfg: KafkaConfig {
            advertised_host: advertised.0,
            advertised_port: advertised.1,
            max_request_bytes: cfg.max_request_bytes,
            max_in_flight_per_connection: cfg.max_in_flight_per_connection,
            max_connections: cfg.max_connections,
            max_fetch_wait: cfg.max_fetch_wait(),
            fetch_max_bytes: cfg.fetch_max_bytes,
            max_connections_per_ip: cfg.max_connections_per_ip,
            connections_max_idle: Duration::from_millis(cfg.connections_max_idle_ms),
            response_write_timeout: Duration::from_millis(cfg.response_write_timeout_ms),
            shutdown_timeout: Duration::from_millis(cfg.shutdown_timeout_ms),
            connections_max_reauth_ms: cfg.connections_max_reauth_ms,
            failed_authentication_delay: Duration::from_millis(cfg.connection_failed_authentication_delay_ms),
            sasl_max_receive_bytes: cfg.sasl_max_receive_bytes.min(cfg.max_request_bytes),
            features: kafka::features::Features::new(cfg.transaction_version),
            inter_broker: cfg.inter_broker().map_err(|e| anyhow::anyhow!("inter_broker_listener_name: {e}"))?,
        },
        users,
        authorizer,
        quotas,
        oauth,
        budget: Arc::new(crate::limits::MemoryBudget::new(cfg.queued_max_request_bytes)),
        per_ip: crate::limits::PerIp::new(cfg.max_connections_per_ip),
        fetch_sessions: Arc::new(kafka::fetch_session::FetchSessions::new(cfg.max_incremental_fetch_session_cache_slots, cfg.max_incremental_fetch_session_cache_partitions)),
        replication: kafka::replication::Replication::new(cfg.node_id, cfg.replica_lag_time_max_ms),
        peers: std::sync::OnceLock::new(),
    }))
}

/// Waits for the next tick of a background loop; false once the broker
/// stops.
async fn next_tick(tick: &mut tokio::time::Interval, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tick.tick() => true,
        _ = stop.changed() => false,
    }
}

fn interval_after_first(every: Duration) -> tokio::time::Interval {
    let start = tokio::time::Instant::now() + every;
    tokio::time::interval_at(start, every)
}

async fn retention_loop(engine: Arc<Engine>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = interval_after_first(every);
    while next_tick(&mut tick, &mut stop).await {
        let e = engine.clone();
        match tokio::task::spawn_blocking(move || e.enforce_retention()).await {
            Ok(Ok(deleted)) if deleted > 0 => tracing::info!(deleted, "retention deleted segments"),
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::error!(error = %err, "retention failed"),
            Err(err) => tracing::error!(error = %err, "retention task panicked"),
        }
    }
}

/// Runs the compactor every `every`, off the async threads; one window at a
/// time (a window that finds more due segments runs again at once); then
/// the cleaner, one keyed topic at a time.
async fn compaction_loop(engine: Arc<Engine>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = interval_after_first(every);
    while next_tick(&mut tick, &mut stop).await {
        loop {
            let e = engine.clone();
            match tokio::task::spawn_blocking(move || e.compact()).await {
                Ok(Ok(Some(_))) if !*stop.borrow() => continue,
                Ok(Ok(_)) => {}
                Ok(Err(err)) => tracing::error!(error = %err, "compaction failed"),
                Err(err) => tracing::error!(error = %err, "compaction task panicked"),
            }
            break;
        }
        // Then key compaction, one topic at a time, while topics are due.
        while !*stop.borrow() {
            let e = engine.clone();
            match tokio::task::spawn_blocking(move || e.clean()).await {
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) => {}
                Ok(Err(err)) => tracing::error!(error = %err, "cleaning failed"),
                Err(err) => tracing::error!(error = %err, "cleaning task panicked"),
            }
            break;
        }
    }
}

/// Runs the coordinator's offset expiry every `retention_ms / 10` (1 s to
/// 10 min, Kafka's `offsets.retention.check.interval.ms`); see
/// [`Coordinator::expire_offsets`].
async fn offset_expiry_loop(coordinator: Coordinator, retention_ms: i64, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis((retention_ms as u64 / 10).clamp(1000, 600_000));
    let mut tick = interval_after_first(every);
    while next_tick(&mut tick, &mut stop).await {
        if let Err(err) = coordinator.expire_offsets(retention_ms).await {
            tracing::error!(error = %err, "offset expiry failed");
        }
    }
}

impl Running {
    /// Graceful stop; see the module docs for the order.
    pub async fn shutdown(self) {
        self.health.ready.store(false, Ordering::Release);
        // Kafka's controlled shutdown: leadership moves to other in-sync
        // replicas while this node still serves, so clients follow it at
        // once and in-flight acks=all produces are answered (or told
        // NOT_LEADER_OR_FOLLOWER and retried there).
        if let Some((_, membership)) = &self.cluster {
            membership.resign(CONTROLLED_SHUTDOWN_TIMEOUT).await;
        }
        let _ = self.stop.send(true);
        self.engine.cancel_compaction();
        let _ = self.kafka.await;
        if let Some(mut rest) = self.rest {
            // Graceful shutdown waits for open connections: a streaming or
            // stalled client must not hold the broker up for ever.
            if tokio::time::timeout(Duration::from_secs(5), &mut rest).await.is_err() {
                tracing::warn!("REST connections still open after 5 s; closing them");
                rest.abort();
            }
        }
        let _ = self.background.await;
        let _ = self.compactor.await;
        let _ = self.expiry.await;
        if let Some((session, _)) = self.cluster {
            let _ = session.await;
        }
        self.engine.shutdown().await;
        let _ = self.admin.await;
    }
}
