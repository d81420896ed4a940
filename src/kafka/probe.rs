//! What the Kafka listener reports for metrics: requests per API and
//! version, latency per API, error codes per API, and connections. Every
//! slot is made when the probe is (one per served API and version), so a
//! request's update is an index and an atomic add; nothing is looked up
//! under a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kafka_protocol::messages::ApiKey;
use prometheus::{exponential_buckets, Histogram, HistogramOpts};

use crate::probe::ConnectionStats;

/// Error codes counted per API: Kafka's are from -1 (UNKNOWN_SERVER_ERROR)
/// to below this.
pub const ERROR_CODES: usize = 128;

#[derive(Debug)]
pub struct ApiSlot {
    pub key: ApiKey,
    pub min_version: i16,
    /// Requests by version, from `min_version`.
    pub requests: Vec<AtomicU64>,
    pub latency: Histogram,
    /// Errors answered, by code + 1 (slot 0 is -1, UNKNOWN_SERVER_ERROR).
    errors: Vec<AtomicU64>,
}

impl ApiSlot {
    /// (error code, times answered) for each code answered at least once.
    pub fn error_counts(&self) -> impl Iterator<Item = (i16, u64)> + '_ {
        self.all_error_counts().filter(|(_, n)| *n > 0)
    }

    /// (error code, times answered) for every code slot, zeros included.
    pub fn all_error_counts(&self) -> impl Iterator<Item = (i16, u64)> + '_ {
        self.errors.iter().enumerate().map(|(i, c)| (i as i16 - 1, c.load(Ordering::Relaxed)))
    }
}

/// Why the broker closed a Kafka connection (or saw it closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed it.
    Client,
    /// A frame length that is negative, too short or over max_request_bytes.
    BadFrame,
    BadHeader,
    /// A body the guard refused, or bytes after it.
    BadBody,
    /// An API or version this broker does not serve.
    Unsupported,
    /// Nothing in flight and nothing sent for connections_max_idle_ms.
    Idle,
    /// A response the client did not take within response_write_timeout_ms.
    WriteTimeout,
    /// A request frame whose body arrived too slowly (see `conn`).
    SlowRequest,
    /// More connections from the address than max_connections_per_ip.
    PerIp,
    Shutdown,
    /// The TLS handshake failed or took longer than the idle limit.
    TlsHandshake,
    /// A request other than ApiVersions or SASL before authentication on
    /// a SASL listener, or a SASL request out of turn.
    Unauthenticated,
    /// SASL authentication failed (after the failure delay and answer).
    AuthFailed,
    /// A request after the SASL session expired that is not a
    /// re-authentication.
    SessionExpired,
}

impl Closed {
    pub const ALL: [Closed; 14] = [
        Closed::Client,
        Closed::BadFrame,
        Closed::BadHeader,
        Closed::BadBody,
        Closed::Unsupported,
        Closed::Idle,
        Closed::WriteTimeout,
        Closed::SlowRequest,
        Closed::PerIp,
        Closed::Shutdown,
        Closed::TlsHandshake,
        Closed::Unauthenticated,
        Closed::AuthFailed,
        Closed::SessionExpired,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Closed::Client => "client",
            Closed::BadFrame => "bad_frame",
            Closed::BadHeader => "bad_header",
            Closed::BadBody => "bad_body",
            Closed::Unsupported => "unsupported",
            Closed::Idle => "idle",
            Closed::WriteTimeout => "write_timeout",
            Closed::SlowRequest => "slow_request",
            Closed::PerIp => "per_ip_limit",
            Closed::Shutdown => "shutdown",
            Closed::TlsHandshake => "tls_handshake",
            Closed::Unauthenticated => "unauthenticated",
            Closed::AuthFailed => "authentication_failed",
            Closed::SessionExpired => "session_expired",
        }
    }
}

#[derive(Debug)]
pub struct KafkaProbe {
    pub enabled: bool,
    /// By api key; `None` for keys this broker does not serve.
    slots: Vec<Option<ApiSlot>>,
    pub connections: ConnectionStats,
    /// Connections closed, by `Closed` (in `Closed::ALL` order).
    closed: [AtomicU64; Closed::ALL.len()],
    /// Authentications by (listener, mechanism, outcome): one update per
    /// authentication, not per request, so a small map under a lock.
    auth: std::sync::Mutex<std::collections::BTreeMap<(String, &'static str, &'static str), u64>>,
    /// Authorization refusals, by resource type (topic, group, cluster,
    /// transactional id).
    denied: [AtomicU64; 4],
    /// Throttles charged by quota kind: how many, and their total in
    /// microseconds.
    throttles: [(AtomicU64, AtomicU64); 3],
}

impl KafkaProbe {
    pub fn new(enabled: bool) -> KafkaProbe {
        let served = super::handlers::supported();
        let top = served.iter().map(|(k, _)| *k as usize).max().unwrap_or(0);
        let mut slots: Vec<Option<ApiSlot>> = (0..=top).map(|_| None).collect();
        for (key, range) in served {
            let opts = HistogramOpts::new("canopy_kafka_request_duration_seconds", "Time from a Kafka request's arrival to its response, by API")
                .const_label("api", format!("{key:?}"))
                .buckets(exponential_buckets(0.000_05, 2.0, 18).expect("buckets"));
            slots[key as usize] = Some(ApiSlot {
                key,
                min_version: range.min,
                requests: (range.min..=range.max).map(|_| AtomicU64::new(0)).collect(),
                latency: Histogram::with_opts(opts).expect("valid histogram"),
                errors: (0..=ERROR_CODES).map(|_| AtomicU64::new(0)).collect(),
            });
        }
        KafkaProbe { enabled, slots, connections: ConnectionStats::default(), closed: Default::default(), auth: Default::default(), denied: Default::default(), throttles: Default::default() }
    }

    fn slot(&self, key: ApiKey) -> Option<&ApiSlot> {
        self.slots.get(key as usize)?.as_ref()
    }

    /// A request of `key` at `version`, answered `started` ago.
    pub fn answered(&self, key: ApiKey, version: i16, started: Instant) {
        if !self.enabled {
            return;
        }
        if let Some(s) = self.slot(key) {
            if let Some(c) = usize::try_from(version - s.min_version).ok().and_then(|i| s.requests.get(i)) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            s.latency.observe(started.elapsed().as_secs_f64());
        }
    }

    /// An error code answered for `key` (per partition where the API has them).
    pub fn error(&self, key: ApiKey, code: i16) {
        if !self.enabled || code == 0 {
            return;
        }
        let Ok(i) = usize::try_from(i32::from(code) + 1) else { return };
        if let Some(c) = self.slot(key).and_then(|s| s.errors.get(i)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection ended, for `why` (counted even with metrics off: it is
    /// one add per connection).
    pub fn closed(&self, why: Closed) {
        let i = Closed::ALL.iter().position(|c| *c == why).expect("every reason is listed");
        self.closed[i].fetch_add(1, Ordering::Relaxed);
    }

    /// (reason, connections closed for it), every reason, zeros included.
    pub fn closed_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Closed::ALL.iter().zip(&self.closed).map(|(c, n)| (c.label(), n.load(Ordering::Relaxed)))
    }

    /// An authentication through `listener` with `mechanism` ended:
    /// `outcome` is `success`, `failure` or `reauthentication`.
    pub fn authenticated(&self, listener: &str, mechanism: &'static str, outcome: &'static str) {
        *self.auth.lock().expect("auth counter lock").entry((listener.to_owned(), mechanism, outcome)).or_default() += 1;
    }

    /// A request was refused by the authorizer.
    pub fn denied(&self, rt: crate::auth::acl::ResourceType) {
        self.denied[rt as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// (resource type, refusals) for every resource type.
    pub fn denied_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        ["topic", "group", "cluster", "transactional_id"].into_iter().zip(&self.denied).map(|(n, c)| (n, c.load(Ordering::Relaxed)))
    }

    /// A quota of `kind` throttled a client for `t`.
    pub fn throttled(&self, kind: crate::auth::quota::Kind, t: std::time::Duration) {
        let (n, us) = &self.throttles[kind as usize];
        n.fetch_add(1, Ordering::Relaxed);
        us.fetch_add(t.as_micros() as u64, Ordering::Relaxed);
    }

    /// (quota key, throttles, seconds) for every quota kind.
    pub fn throttle_counts(&self) -> impl Iterator<Item = (&'static str, u64, f64)> + '_ {
        crate::auth::quota::Kind::ALL.into_iter().zip(&self.throttles).map(|(k, (n, us))| (k.key(), n.load(Ordering::Relaxed), us.load(Ordering::Relaxed) as f64 / 1e6))
    }

    /// ((listener, mechanism, outcome), count) of every authentication seen.
    pub fn auth_counts(&self) -> Vec<((String, &'static str, &'static str), u64)> {
        self.auth.lock().expect("auth counter lock").iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    pub fn slots(&self) -> impl Iterator<Item = &ApiSlot> {
        self.slots.iter().flatten()
    }
}

impl Default for KafkaProbe {
    fn default() -> Self {
        KafkaProbe::new(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_slots_and_unknown_ones_are_ignored() {
        let p = KafkaProbe::new(true);
        let t = Instant::now();
        p.answered(ApiKey::Produce, 9, t);
        p.answered(ApiKey::Produce, 9, t);
        p.answered(ApiKey::Produce, 99, t);
        p.error(ApiKey::Produce, 10);
        p.error(ApiKey::Produce, 999);
        p.error(ApiKey::Produce, -1);
        p.error(ApiKey::Produce, -2);
        p.error(ApiKey::Produce, 0);
        let s = p.slot(ApiKey::Produce).unwrap();
        assert_eq!(s.requests[(9 - s.min_version) as usize].load(Ordering::Relaxed), 2);
        assert_eq!(s.latency.get_sample_count(), 3);
        // -1 is its own code (UNKNOWN_SERVER_ERROR), not 0; 999, -2 and 0
        // (no error) are not counted.
        assert_eq!(s.error_counts().collect::<Vec<_>>(), vec![(-1, 1), (10, 1)]);
        let off = KafkaProbe::new(false);
        off.answered(ApiKey::Produce, 9, t);
        assert_eq!(off.slot(ApiKey::Produce).unwrap().latency.get_sample_count(), 0);
    }
}
