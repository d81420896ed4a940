//! What the engine reports for metrics. The probe is made by whoever runs
//! the engine (the metrics layer registers its histograms) and handed in
//! through `EngineConfig`; updates are atomics, never locks.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{exponential_buckets, Histogram, HistogramOpts};

#[derive(Debug, Clone)]
pub struct EngineProbe {
    /// Off: nothing is recorded (for measuring what recording costs).
    pub enabled: bool,
    /// How long each fsync round of the branch logs takes.
    pub sync_seconds: Histogram,
    /// Bytes each fsync round made durable.
    pub sync_bytes: Histogram,
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
            sync_bytes: h("canopy_fsync_bytes", "Bytes made durable by one fsync round", exponential_buckets(512.0, 4.0, 12).expect("buckets")),
        }
    }

    pub(crate) fn synced(&self, seconds: f64, bytes: u64) {
        if self.enabled {
            self.sync_seconds.observe(seconds);
            self.sync_bytes.observe(bytes as f64);
        }
    }
}

/// A topic's traffic, kept on the topic itself so counting needs no lookup.
#[derive(Debug, Default)]
pub struct Traffic {
    pub records_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl Traffic {
    pub fn appended(&self, records: u64, bytes: u64) {
        self.records_in.fetch_add(records, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn fetched(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}
