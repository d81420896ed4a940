//! Client quotas on a connection (see `auth::quota`): what each request is
//! charged, the throttle time its response carries, and the wait before
//! the connection's next request starts.
//!
//! A Produce is charged its request size, a Fetch its response size, and
//! every request but ApiVersions, the SASL exchange and acks=0 produces the
//! time its handler ran (the sum of its polls, so a fetch parked waiting
//! for data costs nothing while it waits; work a handler hands to the
//! writer or the blocking pool is not counted). The response carries the
//! largest throttle its charges left, and no later request of the
//! connection starts before that time has passed: Kafka mutes the channel
//! for as long, so a client that ignores `throttle_time_ms` is held to its
//! quota all the same.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::REQUEST;
use crate::auth::quota::{Kind, Quotas, Resolved};
use crate::kafka::probe::KafkaProbe;

/// A connection's side of the quotas.
pub struct ConnQuota {
    quotas: Arc<Quotas>,
    probe: Arc<KafkaProbe>,
    base: Instant,
    /// Nanoseconds after `base` before which no request starts (0: none).
    muted_until: AtomicU64,
    /// The quotas of the last client id seen, until the configuration
    /// changes.
    cached: Mutex<Option<(String, Resolved)>>,
}

impl ConnQuota {
    pub fn new(quotas: Arc<Quotas>, probe: Arc<KafkaProbe>) -> ConnQuota {
        ConnQuota { quotas, probe, base: Instant::now(), muted_until: AtomicU64::new(0), cached: Mutex::new(None) }
    }

    /// Waits out the connection's throttle, if one is running (one atomic
    /// load otherwise).
    pub async fn wait_muted(&self) {
        let until = self.muted_until.load(Ordering::Acquire);
        if until == 0 {
            return;
        }
        let until = self.base + Duration::from_nanos(until);
        if until > Instant::now() {
            tokio::time::sleep_until(until.into()).await;
        }
    }

    fn mute_for(&self, d: Duration) {
        let until = (Instant::now() + d).duration_since(self.base).as_nanos() as u64;
        self.muted_until.fetch_max(until, Ordering::AcqRel);
    }

    /// The quotas that apply to `user` and `client` (none configured:
    /// `None`, without a lookup).
    fn resolve(&self, user: &str, client: &str) -> Option<Resolved> {
        if !self.quotas.any() {
            return None;
        }
        let mut cached = self.cached.lock().expect("connection quota lock");
        match cached.as_mut() {
            Some((c, r)) if c == client => *r = self.quotas.resolve(user, client, Some(r)),
            _ => *cached = Some((client.to_owned(), self.quotas.resolve(user, client, None))),
        }
        cached.as_ref().map(|(_, r)| r.clone())
    }
}

/// One request's charges (made only when a quota is configured as the
/// request starts).
#[derive(Default)]
pub struct Usage {
    /// The largest byte-rate throttle charged so far, in nanoseconds.
    bandwidth: AtomicU64,
    /// Handler time not yet charged, in nanoseconds.
    busy: AtomicU64,
    /// Not charged for its time (ApiVersions, SASL, acks=0 produce).
    exempt: AtomicBool,
}

impl Usage {
    pub fn new(exempt: bool) -> Usage {
        Usage { exempt: AtomicBool::new(exempt), ..Usage::default() }
    }
}

/// Runs `f` with the running request's quota state, user and client id;
/// `None` outside a request or for a request that started with no quota
/// configured.
fn with_request<T>(f: impl FnOnce(&ConnQuota, &Usage, &str, &str) -> T) -> Option<T> {
    REQUEST.try_with(|c| c.usage.as_ref().map(|u| f(&c.quota, u, &c.session.principal().name, &c.client_id))).ok().flatten()
}

/// Charges the running request `amount` bytes of `kind` (a Produce's
/// request size, a Fetch's response size) and returns the throttle it
/// leaves (zero: within the quota, or no quota applies). Zero bytes ask
/// whether the budget is in debt (a Fetch that arrives in debt is
/// answered empty, with the time to wait).
pub fn charge(kind: Kind, amount: usize) -> Duration {
    with_request(|q, usage, user, client| {
        let Some(r) = q.resolve(user, client) else { return Duration::ZERO };
        let t = r.charge(kind, amount as f64, Instant::now());
        if !t.is_zero() {
            usage.bandwidth.fetch_max(t.as_nanos() as u64, Ordering::AcqRel);
            q.probe.throttled(kind, t);
            // At once: a Produce pipelined behind this one starts when
            // this one has submitted, before its response is encoded.
            q.mute_for(t);
        }
        t
    })
    .unwrap_or_default()
}

/// The running request is not charged for its time (an acks=0 produce,
/// which Kafka exempts too).
pub fn exempt() {
    let _ = REQUEST.try_with(|c| c.usage.as_ref().map(|u| u.exempt.store(true, Ordering::Release)));
}

/// The most bytes of `kind` the running request should move: a window's
/// worth at its quota (a Fetch asks for no more, as Kafka bounds it).
pub fn window_bytes(kind: Kind) -> Option<usize> {
    with_request(|q, _, user, client| q.resolve(user, client)?.window_amount(kind)).flatten().map(|b| b.max(1.0) as usize)
}

/// Charges the running request's handler time not charged yet to its
/// request quota (none for an exempt request) and returns the throttle
/// that leaves.
fn charge_time(q: &ConnQuota, usage: &Usage, user: &str, client: &str) -> Duration {
    if usage.exempt.load(Ordering::Acquire) {
        return Duration::ZERO;
    }
    let busy = usage.busy.swap(0, Ordering::AcqRel);
    match q.resolve(user, client) {
        Some(r) if r.limits(Kind::Request) => r.charge(Kind::Request, busy as f64, Instant::now()),
        _ => Duration::ZERO,
    }
}

/// The throttle time the running request's response carries, in ms: the
/// largest of its byte-rate throttles and the request-time debt (each at
/// most `quota::WINDOW`). The connection's next request waits as long.
pub fn response_ms() -> i32 {
    with_request(|q, usage, user, client| {
        let bandwidth = Duration::from_nanos(usage.bandwidth.load(Ordering::Acquire));
        if usage.exempt.load(Ordering::Acquire) && bandwidth.is_zero() {
            // Nothing charged, nothing to resolve (ApiVersions, SASL).
            return 0;
        }
        let time = charge_time(q, usage, user, client);
        if !time.is_zero() {
            q.probe.throttled(Kind::Request, time);
        }
        let t = bandwidth.max(time);
        if t.is_zero() {
            return 0;
        }
        q.mute_for(t);
        t.as_millis().max(1) as i32
    })
    .unwrap_or(0)
}

/// A handler's future, its polls timed into its request's [`Usage`] (it
/// runs inside the request's scope); what is left uncharged when it ends
/// (the last poll) is charged then, as debt for the connection's next
/// requests. Used only for requests that start with a quota configured.
pub struct Timed<F> {
    inner: Pin<Box<F>>,
}

impl<F> Timed<F> {
    pub fn new(inner: F) -> Timed<F> {
        Timed { inner: Box::pin(inner) }
    }
}

impl<F: Future> Future for Timed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = Instant::now();
        let out = self.inner.as_mut().poll(cx);
        let took = start.elapsed().as_nanos() as u64;
        let _ = REQUEST.try_with(|c| {
            let Some(usage) = &c.usage else { return };
            usage.busy.fetch_add(took, Ordering::AcqRel);
            if out.is_ready() {
                charge_time(&c.quota, usage, &c.session.principal().name, &c.client_id);
            }
        });
        out
    }
}
