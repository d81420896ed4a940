//! Limits the listeners share: the broker-wide budget of request bytes in
//! memory, connections per source address, and token buckets for rates.
//!
//! # The memory budget
//!
//! One budget (`queued_max_request_bytes`, Kafka's
//! `queued.max.request.bytes`) bounds the request bytes the Kafka listener
//! and the REST bridge hold at once. A Kafka frame is charged when its
//! length prefix arrives, before its body is read, and released when its
//! response has been written; a connection whose next frame does not fit
//! stops being read until it does (backpressure, not an error; waiters are
//! served in order). The REST bridge charges a body's bytes and answers 503
//! when they do not fit, which is what its clients expect.
//!
//! Each Kafka connection holds its first [`FREE_PER_CONNECTION`] bytes
//! outside the budget: a connection costs that much buffer anyway, and it
//! is what keeps a client asking one small thing at a time (ApiVersions,
//! Metadata, a heartbeat) answered while large requests of others wait for
//! the budget. Memory in requests is therefore bounded by the budget plus
//! `max_connections` times that allowance.
//!
//! A frame may be as large as `max_request_bytes` and a REST body as large
//! as `rest_max_body_bytes`; configuration refuses a budget smaller than
//! either, so every request can fit once the others are gone.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of requests in flight each Kafka connection holds outside the
/// shared budget.
pub const FREE_PER_CONNECTION: usize = 64 << 10;

/// The broker-wide budget of request bytes in memory.
#[derive(Debug)]
pub struct MemoryBudget {
    sem: Arc<Semaphore>,
    total: usize,
    /// Connections waiting for the budget right now.
    waiting: AtomicUsize,
    /// Times a Kafka connection had to wait, and REST requests refused.
    pub waits: AtomicU64,
    pub refusals: AtomicU64,
}

/// Bytes held against the budget until dropped.
#[derive(Debug)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// Nothing held (a frame within a connection's free allowance).
    pub fn none() -> Held {
        Held { permit: None }
    }

    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Takes over what `other` holds.
    pub fn absorb(&mut self, mut other: Held) {
        match (self.permit.as_mut(), other.permit.take()) {
            (Some(p), Some(o)) => p.merge(o),
            (None, o) => self.permit = o,
            (_, None) => {}
        }
    }

    /// Gives back all but `n` of the held bytes.
    pub fn shrink_to(&mut self, n: usize) {
        if let Some(p) = self.permit.as_mut() {
            let extra = p.num_permits().saturating_sub(n);
            if extra > 0 {
                drop(p.split(extra));
            }
        }
    }
}

impl MemoryBudget {
    pub fn new(total: usize) -> MemoryBudget {
        // A semaphore holds at most this many permits.
        let total = total.min(Semaphore::MAX_PERMITS);
        MemoryBudget { sem: Arc::new(Semaphore::new(total)), total, waiting: AtomicUsize::new(0), waits: AtomicU64::new(0), refusals: AtomicU64::new(0) }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes held now.
    pub fn in_use(&self) -> usize {
        self.total - self.sem.available_permits()
    }

    /// Kafka connections waiting for room now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Holds `n` bytes, waiting (in arrival order) until they fit. A
    /// request larger than the whole budget waits for all of it.
    pub async fn acquire(&self, n: usize) -> Held {
        if n == 0 {
            return Held::none();
        }
        let n = n.min(self.total) as u32;
        if let Ok(p) = self.sem.clone().try_acquire_many_owned(n) {
            return Held { permit: Some(p) };
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        // Counted while waiting, also if the wait is cancelled.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        let p = self.sem.clone().acquire_many_owned(n).await.expect("the budget's semaphore is never closed");
        Held { permit: Some(p) }
    }

    /// Holds `n` bytes if they fit now, without counting a refusal (the
    /// Kafka reader's first try, before it waits).
    pub fn try_acquire_quiet(&self, n: usize) -> Option<Held> {
        if n == 0 {
            return Some(Held::none());
        }
        let n = n.min(self.total) as u32;
        self.sem.clone().try_acquire_many_owned(n).ok().map(|p| Held { permit: Some(p) })
    }

    /// Holds `n` bytes if they fit now.
    pub fn try_acquire(&self, n: usize) -> Option<Held> {
        if n == 0 {
            return Some(Held::none());
        }
        let n = u32::try_from(n.min(self.total)).unwrap_or(u32::MAX);
        match self.sem.clone().try_acquire_many_owned(n) {
            Ok(p) => Some(Held { permit: Some(p) }),
            Err(_) => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// What one Kafka connection holds: it charges each frame's bytes beyond
/// its free allowance to the budget.
#[derive(Debug, Default)]
pub struct ConnectionBytes {
    held: AtomicUsize,
}

impl ConnectionBytes {
    /// Bytes of a new `len`-byte frame that the budget must cover, given
    /// what the connection already holds. Only the reader adds, so a stale
    /// (larger) `held` read here only over-charges.
    pub fn charge_for(&self, len: usize) -> usize {
        let held = self.held.load(Ordering::Acquire);
        let over = |h: usize| h.saturating_sub(FREE_PER_CONNECTION);
        over(held + len) - over(held)
    }

    pub fn add(&self, len: usize) {
        self.held.fetch_add(len, Ordering::AcqRel);
    }

    pub fn release(&self, len: usize) {
        self.held.fetch_sub(len, Ordering::AcqRel);
    }
}

/// Open connections per source address, under `max_per_ip`.
#[derive(Debug)]
pub struct PerIp {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
    pub refused: AtomicU64,
}

/// One counted connection; dropping it frees the slot.
#[derive(Debug)]
pub struct IpSlot {
    owner: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    pub fn new(max: usize) -> Arc<PerIp> {
        Arc::new(PerIp { max, open: Mutex::new(HashMap::new()), refused: AtomicU64::new(0) })
    }

    /// A slot for a new connection from `ip`, unless it has `max` open.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let mut open = self.open.lock().expect("per-ip lock");
        let n = open.entry(ip).or_default();
        if *n >= self.max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *n += 1;
        Some(IpSlot { owner: self.clone(), ip })
    }

    /// The most connections any one address has open.
    pub fn busiest(&self) -> usize {
        self.open.lock().expect("per-ip lock").values().copied().max().unwrap_or(0)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().expect("per-ip lock");
        if let std::collections::hash_map::Entry::Occupied(mut e) = open.entry(self.ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// A token bucket: `rate` tokens a second, holding at most `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64) -> TokenBucket {
        TokenBucket { rate, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes up to `want` tokens; returns how many it got.
    pub fn take(&self, want: usize, now: Instant) -> usize {
        let mut s = self.state.lock().expect("bucket lock");
        let (tokens, at) = &mut *s;
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        let got = (want as f64).min(tokens.floor()).max(0.0);
        *tokens -= got;
        got as usize
    }

    /// Tokens available now (for metrics).
    pub fn available(&self, now: Instant) -> f64 {
        let s = self.state.lock().expect("bucket lock");
        (s.0 + now.saturating_duration_since(s.1).as_secs_f64() * self.rate).min(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_budget_makes_a_waiter_wait_until_bytes_come_back() {
        let b = Arc::new(MemoryBudget::new(1000));
        let a = b.acquire(800).await;
        assert_eq!(b.in_use(), 800);
        assert!(b.try_acquire(300).is_none(), "does not fit now");
        assert_eq!(b.refusals.load(Ordering::Relaxed), 1);
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(300).await.bytes() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "waits while the bytes are held");
        assert_eq!(b.waiting(), 1);
        drop(a);
        assert_eq!(waiter.await.unwrap(), 300);
        assert_eq!(b.in_use(), 0, "the waiter's hold ended with its task");
        // Larger than the whole budget: it waits for all of it.
        assert_eq!(b.acquire(5000).await.bytes(), 1000);
    }

    #[test]
    fn shrinking_gives_bytes_back() {
        let b = MemoryBudget::new(1000);
        let mut h = b.try_acquire(600).unwrap();
        h.shrink_to(100);
        assert_eq!((h.bytes(), b.in_use()), (100, 100));
        drop(h);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn a_connection_charges_only_beyond_its_allowance() {
        let c = ConnectionBytes::default();
        assert_eq!(c.charge_for(1000), 0);
        c.add(1000);
        assert_eq!(c.charge_for(FREE_PER_CONNECTION), 1000);
        c.add(FREE_PER_CONNECTION);
        assert_eq!(c.charge_for(10), 10, "past the allowance every byte counts");
        c.release(1000);
        assert_eq!(c.charge_for(10), 10);
        c.release(FREE_PER_CONNECTION);
        assert_eq!(c.charge_for(10), 0);
    }

    #[test]
    fn per_ip_slots_are_counted_and_freed() {
        let p = PerIp::new(2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let a = p.admit(ip).unwrap();
        let _b = p.admit(ip).unwrap();
        assert!(p.admit(ip).is_none());
        assert!(p.admit(other).is_some(), "limits are per address");
        assert_eq!(p.busiest(), 2);
        drop(a);
        assert!(p.admit(ip).is_some());
        assert_eq!(p.refused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn buckets_refill_at_their_rate_up_to_the_burst() {
        let t0 = Instant::now();
        let b = TokenBucket::new(10.0, 20.0);
        assert_eq!(b.take(100, t0), 20);
        assert_eq!(b.take(1, t0), 0);
        assert_eq!(b.take(100, t0 + Duration::from_millis(500)), 5);
        assert_eq!(b.take(100, t0 + Duration::from_secs(100)), 20, "never more than the burst");
    }
}
