//! Hash maps for storage whose iteration order a simulation can fix.
//!
//! Storage iterates some of its maps while it writes (the branches staged
//! in a round, the segments retention deletes), so the order of its file
//! operations follows their iteration order. With std's `RandomState`
//! that order changes from run to run, and a simulated disk that draws a
//! fault per operation would not replay a seed. [`Seeded`] is std's
//! `RandomState` (random keys, so names chosen by clients cannot be made to
//! collide) unless the current thread asked for a fixed seed
//! ([`fix_seed_on_this_thread`], the simulator).

use std::cell::Cell;
use std::collections::hash_map::{DefaultHasher, RandomState};
use std::hash::{BuildHasher, Hasher};

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

/// `RandomState` (random SipHash keys per map, as std's maps), or a fixed
/// seed written ahead of every key (a simulation on this thread).
#[derive(Debug, Clone)]
pub struct Seeded(Keys);

#[derive(Debug, Clone)]
enum Keys {
    Random(RandomState),
    Fixed(u64),
}

impl Default for Seeded {
    fn default() -> Self {
        Seeded(match FIXED.with(|f| f.get()) {
            Some(seed) => Keys::Fixed(seed),
            None => Keys::Random(RandomState::new()),
        })
    }
}

impl BuildHasher for Seeded {
    type Hasher = DefaultHasher;
    fn build_hasher(&self) -> DefaultHasher {
        match &self.0 {
            Keys::Random(r) => r.build_hasher(),
            Keys::Fixed(seed) => {
                let mut h = DefaultHasher::new();
                h.write_u64(*seed);
                h
            }
        }
    }
}
