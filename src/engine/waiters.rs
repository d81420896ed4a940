//! Long-poll wake-ups for fetches waiting on new data.

use std::collections::{hash_map, HashMap};
use std::sync::atomic::{self, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::storage::Tp;

/// Long-poll wake-ups: a fetch registers one `Notify` for the tps it waits
/// on (or for every tp, a subtree stream); the engine wakes it when one of
/// them gets new data. The registration removes itself when the fetch ends,
/// woken or not, so fetches for partitions that never move leave nothing
/// behind. Registering and removing take the lock in short chunks: the
/// writer's wake-ups never wait behind one large fetch.
#[derive(Default)]
pub(super) struct Waiters {
    by_tp: Mutex<HashMap<Tp, HashMap<u64, Arc<Notify>>>>,
    /// Woken by new data in any tp (subtree fetches).
    any: Mutex<HashMap<u64, Arc<Notify>>>,
    next_id: AtomicU64,
    /// Registrations alive, for metrics.
    fetches: AtomicUsize,
}

/// Tps registered per lock hold.
const WAITER_CHUNK: usize = 1024;

/// A fetch's registration for wake-ups; dropping it unregisters.
pub struct Registration {
    waiters: Arc<Waiters>,
    id: u64,
    tps: Vec<Tp>,
    any: bool,
}

impl Waiters {
    /// `tps` must be distinct (a fetch names each partition once).
    pub(super) fn register(self: &Arc<Self>, tps: Vec<Tp>, any: bool, n: &Arc<Notify>) -> Registration {
        let id = self.next_id.fetch_add(1, atomic::Ordering::Relaxed);
        for chunk in tps.chunks(WAITER_CHUNK) {
            let mut map = self.by_tp.lock().expect("waiters lock");
            for tp in chunk {
                map.entry(*tp).or_default().insert(id, n.clone());
            }
        }
        if any {
            self.any.lock().expect("waiters lock").insert(id, n.clone());
        }
        self.fetches.fetch_add(1, atomic::Ordering::Relaxed);
        Registration { waiters: self.clone(), id, tps, any }
    }

    pub(super) fn wake(&self, moved: &[(Tp, i64)]) {
        if moved.is_empty() {
            return;
        }
        for n in self.any.lock().expect("waiters lock").values() {
            n.notify_one();
        }
        let map = self.by_tp.lock().expect("waiters lock");
        for (tp, _) in moved {
            for n in map.get(tp).into_iter().flat_map(|m| m.values()) {
                n.notify_one();
            }
        }
    }

    /// (fetches registered, tps they wait on).
    pub(super) fn stats(&self) -> (usize, usize) {
        let tps = self.by_tp.lock().expect("waiters lock").len();
        (self.fetches.load(atomic::Ordering::Relaxed), tps)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for chunk in self.tps.chunks(WAITER_CHUNK) {
            let mut map = self.waiters.by_tp.lock().expect("waiters lock");
            for tp in chunk {
                if let hash_map::Entry::Occupied(mut e) = map.entry(*tp) {
                    e.get_mut().remove(&self.id);
                    if e.get().is_empty() {
                        e.remove();
                    }
                }
            }
        }
        if self.any {
            self.waiters.any.lock().expect("waiters lock").remove(&self.id);
        }
        self.waiters.fetches.fetch_sub(1, atomic::Ordering::Relaxed);
    }
}

