//! Counters the listeners keep and `/metrics` reads. A leaf: it imports
//! nothing of the crate, so the listeners (`kafka`, `rest`) count into it
//! and `metrics` reads them without the two importing each other.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts a listener keeps.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    pub open: AtomicU64,
}

impl ConnectionStats {
    /// An accepted connection, open until the guard drops.
    pub fn opened(&self) -> OpenConnection<'_> {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self)
    }
}

pub struct OpenConnection<'a>(&'a ConnectionStats);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}
