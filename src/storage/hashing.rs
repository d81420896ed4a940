//! Hash maps for storage whose iteration order a simulation can fix.
//!
//! Storage iterates some of its maps while it writes (the branches staged
//! in a round, the segments retention deletes), so the order of its file
//! operations follows their iteration order. With std's `RandomState`
//! that order changes from run to run, and a simulated disk that draws a
//! fault per operation would not replay a seed. [`Seeded`] keys SipHash
//! with a per-process random seed, as `RandomState` does (so names chosen
//! by clients cannot be made to collide), unless the current thread asked
//! for a fixed one ([`fix_seed_on_this_thread`], the simulator).

use std::cell::Cell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

pub type HashMap<K, V> = std::collections::HashMap<K, V, Seeded>;
pub type HashSet<T> = std::collections::HashSet<T, Seeded>;

thread_local! {
    static FIXED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Maps made on this thread from now on iterate in an order fixed by
/// `seed` (for the same insertions).
pub fn fix_seed_on_this_thread(seed: u64) {
    FIXED.with(|f| f.set(Some(seed)));
}

fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish())
}

#[derive(Debug, Clone, Copy)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        Seeded(FIXED.with(|f| f.get()).unwrap_or_else(process_seed))
    }
}

impl BuildHasher for Seeded {
    type Hasher = DefaultHasher;
    fn build_hasher(&self) -> DefaultHasher {
        let mut h = DefaultHasher::new();
        h.write_u64(self.0);
        h
    }
}
