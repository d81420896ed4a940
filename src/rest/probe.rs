//! What the REST bridge reports for metrics: requests by route and status,
//! latency by route, events appended. Slots are fixed when the probe is
//! made, so a request's update is two indexes and atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus::{exponential_buckets, Histogram, HistogramOpts};

/// The router's paths (see `rest::router`); anything else counts as "other".
pub const ROUTES: [&str; 9] = [
    "/topics",
    "/topics/{topic}",
    "/topics/{topic}/partitions/{partition}",
    "/ingest/{*path}",
    "/v3/clusters",
    "/v3/clusters/{cluster}/topics",
    "/v3/clusters/{cluster}/topics/{topic}/records",
    "/v3/clusters/{cluster}/topics/{topic}/records:batch",
    "other",
];

/// Statuses the bridge answers; anything else counts as the last slot, "other".
pub const STATUSES: [u16; 17] = [200, 202, 207, 400, 401, 403, 404, 405, 408, 413, 415, 422, 429, 500, 502, 503, 504];

#[derive(Debug)]
pub struct RestProbe {
    pub enabled: bool,
    /// [route][status slot]
    requests: Vec<Vec<AtomicU64>>,
    pub latency: Vec<Histogram>,
    /// Records and events appended (acked or queued).
    pub events: AtomicU64,
}

impl RestProbe {
    pub fn new(enabled: bool) -> RestProbe {
        RestProbe {
            enabled,
            requests: ROUTES.iter().map(|_| (0..=STATUSES.len()).map(|_| AtomicU64::new(0)).collect()).collect(),
            latency: ROUTES
                .iter()
                .map(|r| {
                    let opts = HistogramOpts::new("canopy_rest_request_duration_seconds", "Time from a REST request's arrival to its response head, by route")
                        .const_label("route", *r)
                        .buckets(exponential_buckets(0.000_05, 2.0, 18).expect("buckets"));
                    Histogram::with_opts(opts).expect("valid histogram")
                })
                .collect(),
            events: AtomicU64::new(0),
        }
    }

    pub fn route_index(path: &str) -> usize {
        ROUTES.iter().position(|r| *r == path).unwrap_or(ROUTES.len() - 1)
    }

    pub fn answered(&self, route: usize, status: u16, started: Instant) {
        if !self.enabled {
            return;
        }
        let slot = STATUSES.iter().position(|s| *s == status).unwrap_or(STATUSES.len());
        self.requests[route][slot].fetch_add(1, Ordering::Relaxed);
        self.latency[route].observe(started.elapsed().as_secs_f64());
    }

    pub fn appended(&self, events: usize) {
        if self.enabled && events > 0 {
            self.events.fetch_add(events as u64, Ordering::Relaxed);
        }
    }

    /// (route, status label, count) of every slot, zeros included: the
    /// series exist from the start, so an alert on a status sees it before
    /// its first occurrence.
    pub fn counts(&self) -> Vec<(&'static str, String, u64)> {
        let mut out = Vec::new();
        for (r, row) in self.requests.iter().enumerate() {
            for (i, c) in row.iter().enumerate() {
                let status = STATUSES.get(i).map_or_else(|| "other".to_owned(), |s| s.to_string());
                out.push((ROUTES[r], status, c.load(Ordering::Relaxed)));
            }
        }
        out
    }
}

impl Default for RestProbe {
    fn default() -> Self {
        RestProbe::new(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_statuses_have_slots_and_the_rest_is_other() {
        let p = RestProbe::new(true);
        let t = Instant::now();
        p.answered(RestProbe::route_index("/ingest/{*path}"), 200, t);
        p.answered(RestProbe::route_index("/nowhere"), 418, t);
        let nonzero: Vec<_> = p.counts().into_iter().filter(|c| c.2 > 0).collect();
        assert_eq!(nonzero, vec![("/ingest/{*path}", "200".to_owned(), 1), ("other", "other".to_owned(), 1)]);
        assert_eq!(p.counts().len(), ROUTES.len() * (STATUSES.len() + 1), "every slot is exported");
        assert_eq!(p.latency[3].get_sample_count(), 1);
    }
}
