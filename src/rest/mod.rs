//! The REST bridge: HTTP ingestion in the Confluent REST Proxy's shape,
//! appending through the same engine API as Kafka Produce (no second hop
//! through a Kafka client).
//!
//! Served so far: REST Proxy v2 produce (`POST /topics/{topic}`,
//! `POST /topics/{topic}/partitions/{partition}`, JSON and binary embedded
//! formats), the topic listing (`GET /topics`, `GET /topics/{topic}`), and
//! the native bulk endpoint `POST /ingest/{topic}` (see `ingest`), and
//! REST Proxy v3 records (single, streaming, batch) with the cluster and
//! topic listings (see `v3`).
//! Bodies may be gzip, deflate or zstd; `rest_max_body_bytes` bounds them
//! after decompression. Errors use REST Proxy's envelope
//! `{"error_code": …, "message": …}` and its codes.

mod append;
pub mod body;
mod coalesce;
mod ingest;
pub mod listener;
pub mod partition;
pub mod probe;
pub mod routes;
mod v2;
mod v3;

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{Credential, Principals};
use crate::engine::{Engine, EngineError};

/// What the bridge is allowed.
#[derive(Debug, Clone)]
pub struct RestConfig {
    /// Largest request body, after decompression.
    pub max_body_bytes: usize,
    /// Decoded body bytes all requests may hold at once; past it, 503.
    pub max_in_flight_bytes: usize,
    /// Requests per second per principal (0: no limit); past it, 429.
    pub rate_limit_per_sec: u32,
    /// Credentials are asked of every request even without a principals
    /// file (HTTP Basic then checks the SCRAM user store).
    pub require_authentication: bool,
    /// How long a request body may take to arrive; past it, 408.
    pub body_timeout: std::time::Duration,
    /// Concurrent small requests for a partition share one batch.
    pub coalesce: bool,
    /// Per-topic defaults for `/ingest` (acks, key pointer).
    pub routes: routes::Routes,
    pub listener: listener::ListenerConfig,
}

impl Default for RestConfig {
    fn default() -> Self {
        RestConfig { max_body_bytes: 16 << 20, max_in_flight_bytes: 256 << 20, rate_limit_per_sec: 0, require_authentication: false, body_timeout: std::time::Duration::from_secs(30), coalesce: true, routes: Default::default(), listener: Default::default() }
    }
}

/// Token buckets by key (a principal, a source address): `rate` tokens a
/// second, holding at most `burst`.
#[derive(Debug, Default)]
struct Buckets {
    buckets: std::sync::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

/// Keys kept at most; past it idle keys are forgotten, and if all are
/// busy, all are (memory and the cost of a call stay bounded whatever
/// the number of clients).
const BUCKET_KEYS: usize = 100_000;

impl Buckets {
    /// Takes a token for `who` (bursts of one second's worth), or says how
    /// many seconds until one is due.
    fn take(&self, who: &str, rate: u32, now: std::time::Instant) -> Result<(), u64> {
        self.check(who, rate as f64, rate as f64, now, true)
    }

    /// Whether `who` has a token now (`take`: and uses it). Only taking
    /// makes a bucket: a look at a key never seen keeps nothing.
    fn check(&self, who: &str, rate: f64, burst: f64, now: std::time::Instant, take: bool) -> Result<(), u64> {
        let mut map = self.buckets.lock().expect("rate buckets lock");
        if !take && !map.contains_key(who) {
            return Ok(());
        }
        if map.len() > BUCKET_KEYS && !map.contains_key(who) {
            map.retain(|_, (_, at)| now.duration_since(*at).as_secs() < 60);
            if map.len() > BUCKET_KEYS / 2 {
                map.clear();
            }
        }
        let (tokens, at) = map.entry(who.to_owned()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            if take {
                *tokens -= 1.0;
            }
            Ok(())
        } else {
            Err(((1.0 - *tokens) / rate).ceil().max(1.0) as u64)
        }
    }
}

/// Body bytes a request holds until it is answered: against the bridge's
/// own budget and the broker-wide one it shares with the Kafka listener.
pub struct InFlight<'a> {
    counter: &'a std::sync::atomic::AtomicUsize,
    n: usize,
    shared: crate::limits::Held,
}

/// Adds `n` to `counter` unless that passes `budget` while something else
/// is held.
fn hold(counter: &std::sync::atomic::AtomicUsize, n: usize, budget: usize) -> Option<InFlight<'_>> {
    let before = counter.fetch_add(n, std::sync::atomic::Ordering::AcqRel);
    let held = InFlight { counter, n, shared: crate::limits::Held::none() };
    (before == 0 || before + n <= budget).then_some(held)
}

impl InFlight<'_> {
    /// Gives back all but `n` of the held bytes.
    fn shrink_to(&mut self, n: usize) {
        let n = n.min(self.n);
        self.counter.fetch_sub(self.n - n, std::sync::atomic::Ordering::AcqRel);
        self.n = n;
        self.shared.shrink_to(n);
    }

    pub fn bytes(&self) -> usize {
        self.n
    }

    /// Takes over what `more` holds: the request gives everything back at
    /// once.
    fn absorb(&mut self, mut more: InFlight<'_>) {
        self.n += std::mem::take(&mut more.n);
        self.shared.absorb(std::mem::replace(&mut more.shared, crate::limits::Held::none()));
    }
}

/// What the structures built per event cost, on top of its bytes (its
/// place in the request's lists, its record, its outcome: about 300 bytes
/// for an event of `/ingest`, from their sizes); held against the budget
/// before they are built.
pub const EVENT_COST_BYTES: usize = 320;

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// State the handlers share.
pub struct Bridge {
    pub engine: Arc<Engine>,
    pub cfg: RestConfig,
    /// Keyless records, per bridge (not per topic: good enough to spread).
    pub round_robin: partition::RoundRobin,
    /// Cluster mode: which partitions this node leads. Keyless records are
    /// spread over those; records for the others go to their leaders.
    cluster: Option<Arc<crate::cluster::Membership>>,
    /// Cluster mode: sends records for partitions another node leads to
    /// it, as Produce requests over the inter-broker listener.
    pub forwarder: Option<Arc<crate::kafka::replication::peers::Forwarder>>,
    /// Who may produce where; empty: no authentication.
    pub principals: Arc<Principals>,
    rate: Buckets,
    /// Failed authentications by source address.
    auth_failures: Buckets,
    in_flight: std::sync::atomic::AtomicUsize,
    coalescer: Arc<coalesce::Coalescer>,
    pub connections: Arc<listener::ConnectionStats>,
    /// Requests, statuses, latency and events, for metrics.
    pub probe: Arc<probe::RestProbe>,
    /// Request bytes in memory, broker-wide (shared with the Kafka listener).
    budget: Arc<crate::limits::MemoryBudget>,
    /// The Kafka listener's authorizer, when it is on: a REST principal
    /// `name` is `User:name` to it (WRITE to produce, DESCRIBE to list).
    authorizer: Option<Arc<crate::auth::acl::Authorizer>>,
    /// The Kafka listener's client quotas: a REST principal `name` produces
    /// as user `name` with client id [`REST_CLIENT_ID`].
    quotas: Option<Arc<crate::auth::quota::Quotas>>,
    /// The Kafka listener's SCRAM users: HTTP Basic passwords are checked
    /// against them, as SASL PLAIN is.
    users: Option<Arc<crate::auth::users::UserStore>>,
    /// The cluster's id (cluster mode: etcd's; else the engine's).
    cluster_id: Option<String>,
    /// Basic credentials verified lately (see [`Verified`]).
    verified: Verified,
}

/// Basic credentials that passed PBKDF2 lately, so a client sending them
/// with every request pays it once: keyed by an HMAC of user and password
/// under a key fresh each start (no password, nor an unsalted hash of one,
/// is kept), valid while the user store has not changed and for at most
/// [`VERIFIED_FOR`].
struct Verified {
    key: ring::hmac::Key,
    seen: std::sync::Mutex<std::collections::HashMap<[u8; 32], (u64, std::time::Instant)>>,
}

const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_secs(300);
/// Entries kept before the cache is emptied (it refills from PBKDF2).
const VERIFIED_KEYS: usize = 10_000;

impl Default for Verified {
    fn default() -> Verified {
        let key = crate::auth::scram::random_bytes(32);
        Verified { key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key), seen: Default::default() }
    }
}

impl Verified {
    fn tag(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut ctx = ring::hmac::Context::with_key(&self.key);
        ctx.update(&(user.len() as u64).to_be_bytes());
        ctx.update(user.as_bytes());
        ctx.update(password);
        ctx.sign().as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
    }

    fn holds(&self, tag: &[u8; 32], generation: u64) -> bool {
        self.seen.lock().expect("verified lock").get(tag).is_some_and(|(g, at)| *g == generation && at.elapsed() < VERIFIED_FOR)
    }

    fn remember(&self, tag: [u8; 32], generation: u64) {
        let mut seen = self.seen.lock().expect("verified lock");
        if seen.len() >= VERIFIED_KEYS {
            seen.clear();
        }
        seen.insert(tag, (generation, std::time::Instant::now()));
    }
}

/// Keyless records' partitions for one request ([`Bridge::keyless`]).
pub struct Keyless<'b> {
    bridge: &'b Bridge,
    partitions: i32,
    /// Cluster mode: the partitions this node leads (none: all).
    led: Option<Vec<i32>>,
}

impl Keyless<'_> {
    pub fn pick(&self) -> i32 {
        match &self.led {
            Some(led) => led[self.bridge.round_robin.pick(led.len() as i32) as usize],
            None => self.bridge.round_robin.pick(self.partitions),
        }
    }
}

/// The client id REST produce requests count under in client quotas.
pub const REST_CLIENT_ID: &str = "canopy-rest";

impl Bridge {
    pub fn new(engine: Arc<Engine>, cfg: RestConfig, principals: Arc<Principals>, probe: Arc<probe::RestProbe>, budget: Arc<crate::limits::MemoryBudget>) -> Bridge {
        Bridge {
            engine,
            cfg,
            round_robin: Default::default(),
            cluster: None,
            forwarder: None,
            principals,
            rate: Buckets::default(),
            auth_failures: Buckets::default(),
            in_flight: Default::default(),
            coalescer: Default::default(),
            connections: Default::default(),
            probe,
            budget,
            authorizer: None,
            quotas: None,
            users: None,
            cluster_id: None,
            verified: Verified::default(),
        }
    }

    /// Asks `authorizer` too, when it is enabled.
    pub fn with_authorizer(mut self, authorizer: Arc<crate::auth::acl::Authorizer>) -> Bridge {
        self.authorizer = authorizer.enabled().then_some(authorizer);
        self
    }

    /// Checks HTTP Basic passwords against `users` too.
    pub fn with_users(mut self, users: Arc<crate::auth::users::UserStore>) -> Bridge {
        self.users = Some(users);
        self
    }

    /// Must requests carry credentials?
    pub fn requires_authentication(&self) -> bool {
        !self.principals.is_empty() || self.cfg.require_authentication
    }

    /// Counts produce bytes against the client quotas (`producer_byte_rate`
    /// of the principal's user, client id [`REST_CLIENT_ID`]).
    pub fn with_quotas(mut self, quotas: Arc<crate::auth::quota::Quotas>) -> Bridge {
        self.quotas = Some(quotas);
        self
    }

    /// The id `/v3/clusters` answers (Kafka's Metadata gives the same).
    pub fn with_cluster_id(mut self, id: String) -> Bridge {
        self.cluster_id = Some(id);
        self
    }

    /// Cluster mode (`Some`): keyless records go to partitions this node
    /// leads; records for the others go to their leaders by `forwarder`.
    pub fn map_cluster(mut self, membership: Option<Arc<crate::cluster::Membership>>, forwarder: Option<Arc<crate::kafka::replication::peers::Forwarder>>) -> Bridge {
        self.cluster = membership;
        self.forwarder = forwarder;
        self
    }

    /// Whether this node leads `topic`'s partition `p` (always, in
    /// single-node mode).
    pub fn leads(&self, view: Option<&crate::cluster::ClusterView>, topic: &str, p: i32) -> bool {
        match (&self.cluster, view) {
            (Some(m), Some(v)) => m.leads(v, topic, p),
            _ => true,
        }
    }

    /// The leader epoch this node leads `topic`'s partition `p` in, by
    /// `view` (`None`: it does not lead it; 0 in single-node mode).
    pub fn lead_epoch(&self, view: Option<&crate::cluster::ClusterView>, topic: &str, p: i32) -> Option<i32> {
        match (&self.cluster, view) {
            (Some(m), Some(v)) => m.lead(v, topic, p).ok(),
            _ => Some(0),
        }
    }

    /// This node's id (cluster mode).
    pub fn node_id(&self) -> Option<i32> {
        self.cluster.as_ref().map(|m| m.node_id())
    }

    /// The view partitions are placed by (cluster mode).
    pub fn view(&self) -> Option<Arc<crate::cluster::ClusterView>> {
        self.cluster.as_ref().map(|m| m.view())
    }

    /// Where one request's keyless records go: round-robin (sticky for a
    /// while) over the partitions this node leads; over all when it leads
    /// none (they then go to their leaders), and always over all in
    /// single-node mode.
    pub fn keyless(&self, view: Option<&crate::cluster::ClusterView>, t: &crate::engine::Topic) -> Keyless<'_> {
        let led = view.map(|v| (0..t.partitions()).filter(|p| self.leads(Some(v), t.name(), *p)).collect::<Vec<i32>>()).filter(|led| !led.is_empty());
        Keyless { bridge: self, partitions: t.partitions(), led }
    }

    pub fn cluster_id(&self) -> &str {
        self.cluster_id.as_deref().unwrap_or_else(|| self.engine.cluster_id())
    }

    /// The producer quota that applies to `who` (none configured: `None`).
    fn producer_quota(&self, who: Option<&str>) -> Option<crate::auth::quota::Resolved> {
        let q = self.quotas.as_ref().filter(|q| q.any())?;
        let r = q.resolve(who.unwrap_or("ANONYMOUS"), REST_CLIENT_ID, None);
        r.limits(crate::auth::quota::Kind::Produce).then_some(r)
    }

    /// Charges `bytes` of a produce body to `who`'s producer quota and
    /// returns the debt it leaves, which refuses the principal's next
    /// produce (429 with Retry-After) until it is repaid (a stream waits
    /// it out before reading on).
    pub fn charge(&self, who: Option<&str>, bytes: usize) -> std::time::Duration {
        match self.producer_quota(who) {
            Some(r) => r.charge(crate::auth::quota::Kind::Produce, bytes as f64, std::time::Instant::now()),
            None => std::time::Duration::ZERO,
        }
    }

    /// Which topics principal `who` (as [`Bridge::authorize`] returned it)
    /// may see, for GET /topics and the v3 topic list: all without the
    /// authorizer, else those it may DESCRIBE.
    pub fn describable(&self, who: Option<String>) -> impl Fn(&str) -> bool + '_ {
        let principal = crate::auth::KafkaPrincipal::user(who.unwrap_or_else(|| "ANONYMOUS".into()));
        move |topic: &str| {
            self.authorizer.as_ref().is_none_or(|a| {
                a.authorize(&crate::auth::acl::Request { principal: &principal, host: "", operation: crate::auth::acl::Operation::Describe, resource_type: crate::auth::acl::ResourceType::Topic, name: topic })
            })
        }
    }

    /// The topic, created with the defaults when auto-creation is on (that
    /// blocks on the catalog, so off the async threads; the common case,
    /// an existing topic, does not leave them).
    pub async fn topic(&self, name: &str) -> Result<Arc<crate::engine::Topic>, RestError> {
        if crate::engine::subtree::Subtree::parse(name).is_some() {
            return Err(RestError::unprocessable(format!("{name} is a read-only subtree stream")));
        }
        // Internal topics (cluster mode's coordinator shards) are not
        // written by clients.
        if crate::engine::topics::is_internal(name) {
            return Err(RestError::unprocessable(format!("{name} is an internal topic")));
        }
        if let Some(t) = self.engine.topic(name) {
            return Ok(t);
        }
        let engine = self.engine.clone();
        let owned = name.to_owned();
        tokio::task::spawn_blocking(move || engine.topic_or_create(&owned, &mut engine.auto_create_allowance()))
            .await
            .map_err(|e| RestError::new(StatusCode::INTERNAL_SERVER_ERROR, 50001, e.to_string()))?
            .map_err(|e| engine_error(e, name))
    }

    /// Reads and decodes a request body (`Content-Encoding`, the body
    /// limit, the body deadline) and holds its bytes against the in-flight
    /// budget until the returned guard is dropped. A declared length is
    /// checked and held before a byte is read.
    pub async fn body(&self, headers: &HeaderMap, body: axum::body::Body) -> Result<(bytes::Bytes, InFlight<'_>), RestError> {
        let limit = self.cfg.max_body_bytes;
        let declared = headers.get("content-length").and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if let Some(n) = declared.filter(|&n| n > limit) {
            if n <= body::DRAIN_BYTES {
                let _ = tokio::time::timeout(self.cfg.body_timeout, body::drain(body, n)).await;
            }
            return Err(body::BodyError::TooLarge(limit).into());
        }
        let wire = self.reserve(declared.unwrap_or(0))?;
        let raw = tokio::time::timeout(self.cfg.body_timeout, body::read_raw(body, limit))
            .await
            .map_err(|_| RestError::new(StatusCode::REQUEST_TIMEOUT, 408, format!("the request body did not arrive within {} ms", self.cfg.body_timeout.as_millis())))??;
        let encoding = headers.get("content-encoding").and_then(|v| v.to_str().ok()).map(str::to_owned);
        // Inflating may produce up to this much: hold it meanwhile, so
        // concurrent bombs are bounded by the budget, not by their number.
        drop(wire);
        let mut held = self.reserve(body::inflated_bound(raw.len(), encoding.as_deref(), limit))?;
        let decoded = match encoding {
            // Inflating a large body is CPU work: on the CPU pool, off the
            // async threads.
            Some(e) if raw.len() > 64 << 10 => self
                .engine
                .run_cpu(move || body::decode(raw, Some(&e), limit))
                .await
                .ok_or_else(|| RestError::new(StatusCode::SERVICE_UNAVAILABLE, 50302, "the broker is shutting down"))??,
            e => body::decode(raw, e.as_deref(), limit)?,
        };
        held.shrink_to(decoded.len());
        Ok((decoded, held))
    }

    /// Holds `events` events' structures more for the request that holds
    /// `held` (see [`EVENT_COST_BYTES`]). A request whose events could never
    /// fit the budget, even alone, is refused for good (413: fewer events
    /// per request); one that does not fit now gets 503 and Retry-After.
    pub fn hold_events(&self, held: &mut InFlight<'_>, events: usize) -> Result<(), RestError> {
        let cap = self.cfg.max_in_flight_bytes.min(self.budget.total());
        let n = events.saturating_mul(EVENT_COST_BYTES);
        if n.saturating_add(held.bytes()) > cap {
            return Err(RestError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                413,
                format!("{events} events in one request need more memory than the broker gives all requests at once ({cap} bytes at {EVENT_COST_BYTES} per event): send fewer per request"),
            ));
        }
        // Within the cap, so alone (holding just its own bytes) it fits.
        held.absorb(self.reserve(n)?);
        Ok(())
    }

    /// Holds `n` decoded body bytes against `max_in_flight_bytes`: 503 with
    /// Retry-After when the bridge is saturated. A request larger than the
    /// whole budget still passes when it is alone.
    pub fn reserve(&self, n: usize) -> Result<InFlight<'_>, RestError> {
        let saturated = || {
            let mut e = RestError::new(StatusCode::SERVICE_UNAVAILABLE, 50302, "the broker is saturated: too many request bytes in flight; retry later");
            e.retry_after = Some(1);
            e
        };
        let mut held = hold(&self.in_flight, n, self.cfg.max_in_flight_bytes).ok_or_else(saturated)?;
        held.shared = self.budget.try_acquire(n).ok_or_else(saturated)?;
        Ok(held)
    }

    /// Checks the request's credentials (`Authorization: Bearer …`,
    /// `Authorization: Basic …` or `X-API-Key: …`) and, for a produce, that
    /// the principal may write `topic`: 401 without or with wrong
    /// credentials, 403 outside its topics. Called before the body is read,
    /// so a refused request writes nothing. Returns the principal's name
    /// (`None`: no principals are configured).
    pub async fn authorize(&self, headers: &HeaderMap, topic: Option<&str>) -> Result<Option<String>, RestError> {
        let who = self.authenticate(headers).await?;
        // With the authorizer on, a produce also needs WRITE on the topic
        // for `User:<name>` (`User:ANONYMOUS` without principals); ACLs
        // naming a host do not match REST requests (only `*` does).
        if let (Some(a), Some(t)) = (&self.authorizer, topic) {
            let principal = crate::auth::KafkaPrincipal::user(who.clone().unwrap_or_else(|| "ANONYMOUS".into()));
            let req = crate::auth::acl::Request { principal: &principal, host: "", operation: crate::auth::acl::Operation::Write, resource_type: crate::auth::acl::ResourceType::Topic, name: t };
            if !a.authorize(&req) {
                return Err(RestError::new(StatusCode::FORBIDDEN, 40301, format!("{principal} may not produce to {t}")));
            }
            // Creating the topic on the way needs CREATE, on the cluster
            // or the topic, as on the Kafka port.
            let create = |rt, name| a.authorize(&crate::auth::acl::Request { operation: crate::auth::acl::Operation::Create, resource_type: rt, name, ..req });
            if self.engine.topic(t).is_none() && !(create(crate::auth::acl::ResourceType::Cluster, crate::auth::acl::CLUSTER_NAME) || create(crate::auth::acl::ResourceType::Topic, t)) {
                return Err(RestError::new(StatusCode::FORBIDDEN, 40301, format!("{principal} may not create {t}")));
            }
        }
        // A producer over its byte rate waits, as a throttled Kafka client
        // does; the body is not read.
        if let Some(r) = topic.and_then(|_| self.producer_quota(who.as_deref())) {
            let debt = r.debt(crate::auth::quota::Kind::Produce, std::time::Instant::now());
            if !debt.is_zero() {
                let mut e = RestError::new(StatusCode::TOO_MANY_REQUESTS, 42903, format!("{} is over its producer_byte_rate quota", who.as_deref().unwrap_or("ANONYMOUS")));
                e.retry_after = Some(debt.as_secs_f64().ceil().max(1.0) as u64);
                return Err(e);
            }
        }
        match &who {
            // Without principals every client shares one limit.
            None => self.limit("(anonymous)")?,
            Some(name) => {
                // A principal of the principals file produces where its
                // `produce` list says. A SCRAM user it does not name is
                // left to the authorizer when it is on (as on the Kafka
                // port); with it off and a principals file, the file is the
                // list of who may produce, as it always was.
                let refused = |t: &str| match self.principals.find(name) {
                    Some(p) => !p.may_produce(t),
                    None => self.authorizer.is_none() && !self.principals.is_empty(),
                };
                if let Some(t) = topic.filter(|t| refused(t)) {
                    return Err(RestError::new(StatusCode::FORBIDDEN, 40301, format!("{name} may not produce to {t}")));
                }
                self.limit(name)?
            }
        }
        Ok(who)
    }

    /// The request's principal (`None`: no credentials are asked for);
    /// 401 without or with wrong ones. Tokens are the principals file's;
    /// Basic passwords are the SCRAM users' (PBKDF2 on the blocking pool,
    /// once per [`Verified`] entry).
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Option<String>, RestError> {
        if !self.requires_authentication() {
            return Ok(None);
        }
        let unauthorized = |why: &str| RestError::new(StatusCode::UNAUTHORIZED, 40101, why.to_owned());
        let auth = headers.get("authorization").map(|v| v.as_bytes());
        let basic;
        let credential = match (auth, headers.get("x-api-key")) {
            (Some(a), _) if a.len() > 7 && a[..7].eq_ignore_ascii_case(b"bearer ") => Credential::Token(a[7..].trim_ascii()),
            (Some(a), _) if a.len() > 6 && a[..6].eq_ignore_ascii_case(b"basic ") => {
                use base64::Engine as _;
                basic = base64::engine::general_purpose::STANDARD.decode(a[6..].trim_ascii()).map_err(|_| unauthorized("malformed Basic credentials"))?;
                let colon = basic.iter().position(|&c| c == b':').ok_or_else(|| unauthorized("malformed Basic credentials"))?;
                let user = std::str::from_utf8(&basic[..colon]).map_err(|_| unauthorized("malformed Basic credentials"))?;
                Credential::Password { user, password: &basic[colon + 1..] }
            }
            (Some(_), _) => return Err(unauthorized("unsupported Authorization scheme (Bearer or Basic)")),
            (None, Some(k)) => Credential::Token(k.as_bytes()),
            (None, None) => return Err(unauthorized("authentication required")),
        };
        if let Some(principal) = self.principals.authenticate(&credential) {
            return Ok(Some(principal.name.clone()));
        }
        if let (Credential::Password { user, password }, Some(users)) = (&credential, &self.users) {
            let (generation, tag) = (users.generation(), self.verified.tag(user, password));
            if self.verified.holds(&tag, generation) {
                return Ok(Some(user.to_string()));
            }
            let (users, u, p) = (users.clone(), user.to_string(), password.to_vec());
            if tokio::task::spawn_blocking(move || users.verify_password(&u, &p)).await.unwrap_or(false) {
                self.verified.remember(tag, generation);
                return Ok(Some(user.to_string()));
            }
        }
        Err(unauthorized("invalid credentials"))
    }

    /// The principal's rate limit: 429 with Retry-After past it.
    fn limit(&self, who: &str) -> Result<(), RestError> {
        if self.cfg.rate_limit_per_sec == 0 {
            return Ok(());
        }
        self.rate.take(who, self.cfg.rate_limit_per_sec, std::time::Instant::now()).map_err(|wait| {
            let mut e = RestError::new(StatusCode::TOO_MANY_REQUESTS, 42901, format!("{who} is over its rate limit of {} requests per second", self.cfg.rate_limit_per_sec));
            e.retry_after = Some(wait);
            e
        })
    }
}

/// REST Proxy's error envelope.
#[derive(Debug, Clone)]
pub struct RestError {
    pub status: StatusCode,
    pub code: u32,
    pub message: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl RestError {
    pub fn new(status: StatusCode, code: u32, message: impl Into<String>) -> RestError {
        RestError { status, code, message: message.into(), retry_after: None }
    }
    pub fn topic_not_found(topic: &str) -> RestError {
        RestError::new(StatusCode::NOT_FOUND, 40401, format!("Topic {topic} not found."))
    }
    pub fn partition_not_found(p: i32) -> RestError {
        RestError::new(StatusCode::NOT_FOUND, 40402, format!("Partition {p} not found."))
    }
    pub fn unprocessable(message: impl Into<String>) -> RestError {
        RestError::new(StatusCode::UNPROCESSABLE_ENTITY, 42206, message)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error_code": self.code, "message": self.message});
        let mut r = (self.status, [("content-type", "application/vnd.kafka.v2+json")], body.to_string()).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("Basic realm=\"canopy\", Bearer"));
        }
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from(s));
        }
        r
    }
}

impl From<body::BodyError> for RestError {
    fn from(e: body::BodyError) -> RestError {
        match e {
            body::BodyError::TooLarge(_) => RestError::new(StatusCode::PAYLOAD_TOO_LARGE, 413, e.to_string()),
            body::BodyError::Encoding(_) => RestError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, 415, e.to_string()),
            body::BodyError::Corrupt(..) | body::BodyError::Read(_) => RestError::new(StatusCode::BAD_REQUEST, 400, e.to_string()),
        }
    }
}

/// The REST answer to an engine error.
pub(crate) fn engine_error(e: EngineError, topic: &str) -> RestError {
    match e {
        EngineError::UnknownTopicOrPartition => RestError::topic_not_found(topic),
        EngineError::InvalidTopic(e) => RestError::unprocessable(e.to_string()),
        // A null key for a compacted topic, a timestamp out of its range.
        EngineError::RecordsRefused(e) => RestError::unprocessable(e.to_string()),
        EngineError::MessageTooLarge { .. } => RestError::new(StatusCode::PAYLOAD_TOO_LARGE, 413, e.to_string()),
        EngineError::ShuttingDown => RestError::new(StatusCode::SERVICE_UNAVAILABLE, 50302, e.to_string()),
        EngineError::AutoCreateDeferred | EngineError::Cluster(_) => {
            let mut e = RestError::new(StatusCode::SERVICE_UNAVAILABLE, 50302, e.to_string());
            e.retry_after = Some(1);
            e
        }
        e => RestError::new(StatusCode::INTERNAL_SERVER_ERROR, 50001, e.to_string()),
    }
}

pub fn router(bridge: Arc<Bridge>) -> Router {
    Router::new()
        .route("/topics", get(v2::list_topics))
        .route("/topics/{topic}", get(v2::get_topic).post(v2::produce_topic))
        .route("/topics/{topic}/partitions/{partition}", post(v2::produce_partition))
        .route("/ingest/{*path}", post(ingest::ingest))
        .route("/v3/clusters", get(v3::clusters))
        .route("/v3/clusters/{cluster}/topics", get(v3::topics))
        .route("/v3/clusters/{cluster}/topics/{topic}/records", post(v3::records))
        .route("/v3/clusters/{cluster}/topics/{topic}/records:batch", post(v3::batch))
        // `layer`, not `route_layer`: unrouted requests (404, 405) are
        // counted too, as route "other".
        .layer(axum::middleware::from_fn_with_state(bridge.clone(), track))
        .with_state(bridge)
}

/// Failed authentications an address may make at once, and then a second.
const AUTH_FAILURE_BURST: f64 = 10.0;
const AUTH_FAILURES_PER_SEC: f64 = 1.0;

/// Counts each request by its route and status, with its latency; and
/// throttles addresses that keep failing authentication: past a burst of
/// failures, an address is answered 429 (with Retry-After) before its
/// credentials are even looked at, until its allowance refills.
async fn track(axum::extract::State(b): axum::extract::State<Arc<Bridge>>, path: Option<axum::extract::MatchedPath>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let path = path.as_ref().map_or("other", |p| p.as_str());
    let route = probe::RestProbe::route_index(path);
    let peer = req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip().to_string());
    if let Some(ip) = peer.as_deref().filter(|_| b.requires_authentication()) {
        if let Err(wait) = b.auth_failures.check(ip, AUTH_FAILURES_PER_SEC, AUTH_FAILURE_BURST, started, false) {
            let mut e = RestError::new(StatusCode::TOO_MANY_REQUESTS, 42902, "too many failed authentications from this address; retry later");
            e.retry_after = Some(wait);
            let resp = e.into_response();
            b.probe.answered(route, resp.status().as_u16(), started);
            return resp;
        }
    }
    let span = tracing::debug_span!("rest", route = path, method = %req.method());
    let resp = tracing::Instrument::instrument(next.run(req), span).await;
    if resp.status() == StatusCode::UNAUTHORIZED {
        if let Some(ip) = &peer {
            let _ = b.auth_failures.check(ip, AUTH_FAILURES_PER_SEC, AUTH_FAILURE_BURST, std::time::Instant::now(), true);
        }
    }
    b.probe.answered(route, resp.status().as_u16(), started);
    resp
}

pub async fn serve(listener: TcpListener, bridge: Arc<Bridge>, shutdown: watch::Receiver<bool>) {
    let cfg = bridge.cfg.listener.clone();
    let stats = bridge.connections.clone();
    listener::serve(listener, router(bridge), cfg, stats, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_allow_the_rate_then_say_when() {
        let b = Buckets::default();
        let t0 = std::time::Instant::now();
        for _ in 0..5 {
            assert!(b.take("p", 5, t0).is_ok());
        }
        assert_eq!(b.take("p", 5, t0), Err(1));
        assert!(b.take("q", 5, t0).is_ok(), "buckets are per principal");
        assert!(b.take("p", 5, t0 + std::time::Duration::from_millis(250)).is_ok(), "refilled at the rate");
    }

    #[test]
    fn the_in_flight_budget_refuses_only_while_others_hold_bytes() {
        let c = std::sync::atomic::AtomicUsize::new(0);
        let big = hold(&c, 5000, 1000).expect("alone, even over the budget");
        assert!(hold(&c, 1, 1000).is_none(), "saturated");
        assert_eq!(c.load(std::sync::atomic::Ordering::Acquire), 5000, "a refusal gives its bytes back");
        drop(big);
        let a = hold(&c, 600, 1000).unwrap();
        let b = hold(&c, 400, 1000).unwrap();
        assert!(hold(&c, 1, 1000).is_none());
        drop((a, b));
        assert_eq!(c.load(std::sync::atomic::Ordering::Acquire), 0);
    }
}
