//! What the engine reports for metrics. The probe is made by whoever runs
//! the engine (the metrics layer registers its histograms) and handed in
//! through `EngineConfig`; updates are atomics, never locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::{exponential_buckets, Histogram, HistogramOpts};

#[derive(Debug, Clone)]
pub struct EngineProbe {
    /// Off: nothing is recorded (for measuring what recording costs).
    pub enabled: bool,
    /// How long each fsync round of the branch logs takes.
    pub sync_seconds: Histogram,
    /// Bytes each fsync round made durable.
    pub sync_bytes: Histogram,
    /// The broker's traffic totals (every topic's [`Traffic`] adds to them).
    pub traffic: Arc<Counters>,
}

impl Default for EngineProbe {
    fn default() -> Self {
        EngineProbe::new(true)
    }
}

impl EngineProbe {
    pub fn new(enabled: bool) -> EngineProbe {
        let h = |name: &str, help: &str, buckets: Vec<f64>| Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid histogram");
        EngineProbe {
            enabled,
            sync_seconds: h("canopy_fsync_duration_seconds", "Time of one fsync round of the branch logs", exponential_buckets(0.000_05, 2.0, 16).expect("buckets")),
            sync_bytes: h("canopy_fsync_bytes", "Bytes written since the previous fsync round, made durable by this one", exponential_buckets(512.0, 4.0, 12).expect("buckets")),
            traffic: Arc::default(),
        }
    }

    /// One fsync round. Idle rounds of the interval policy (nothing
    /// written since the last one) are not observations of fsync cost.
    pub(crate) fn synced(&self, seconds: f64, bytes: u64) {
        if self.enabled && bytes > 0 {
            self.sync_seconds.observe(seconds);
            self.sync_bytes.observe(bytes as f64);
        }
    }
}

/// Records and bytes in and out: one set per topic, one for the broker.
#[derive(Debug, Default)]
pub struct Counters {
    pub records_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl Counters {
    fn appended(&self, records: u64, bytes: u64) {
        self.records_in.fetch_add(records, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts bytes sent in a fetch response.
    pub fn fetched(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A topic's traffic, kept on the topic itself so counting needs no lookup.
/// Each update also goes to the broker's totals, which outlive the topic:
/// a deleted topic takes its own counters with it, the totals never go back.
#[derive(Debug)]
pub struct Traffic {
    pub topic: Counters,
    pub broker: Arc<Counters>,
}

impl Traffic {
    pub fn new(broker: Arc<Counters>) -> Traffic {
        Traffic { topic: Counters::default(), broker }
    }

    /// Counts a batch once it is in the log (not when it is only queued:
    /// a refused, failed or duplicate batch is not traffic in).
    pub fn appended(&self, records: u64, bytes: u64) {
        self.topic.appended(records, bytes);
        self.broker.appended(records, bytes);
    }

    /// Counts bytes sent in a fetch response.
    pub fn fetched(&self, bytes: u64) {
        self.topic.fetched(bytes);
        self.broker.fetched(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sync_rounds_are_not_observed() {
        let p = EngineProbe::new(true);
        p.synced(0.001, 0);
        assert_eq!(p.sync_seconds.get_sample_count(), 0);
        p.synced(0.002, 4096);
        assert_eq!((p.sync_seconds.get_sample_count(), p.sync_bytes.get_sample_sum()), (1, 4096.0));
        let off = EngineProbe::new(false);
        off.synced(0.002, 4096);
        assert_eq!(off.sync_seconds.get_sample_count(), 0);
    }
}
