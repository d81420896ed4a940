//! The admin HTTP listener: `/health` (the process is up), `/ready`
//! (storage is recovered, listeners are bound and the broker is not
//! shutting down) and `/metrics` (Prometheus text format).
//!
//! Subsystems report through probes they define and are handed
//! (`engine::probe`, `kafka::probe`, `rest::probe`): atomics and
//! lock-free histograms, made once. State that already exists (offsets,
//! the tip, compaction counters, group commits) is read when Prometheus
//! scrapes, never kept twice. See `scrape` for the names.

mod scrape;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use scrape::Metrics;

#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
}

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

/// Set once the engine is open; until then `/metrics` answers 503.
pub type MetricsSlot = Arc<std::sync::OnceLock<Arc<Metrics>>>;

pub fn router(health: Arc<Health>, metrics: MetricsSlot) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/ready",
            get(|State((h, _)): State<(Arc<Health>, MetricsSlot)>| async move {
                if h.ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State((_, m)): State<(Arc<Health>, MetricsSlot)>| async move {
                let Some(m) = m.get().cloned() else {
                    return (StatusCode::SERVICE_UNAVAILABLE, "recovering\n").into_response();
                };
                // The scrape reads the catalog (group commits): off the async threads.
                match tokio::task::spawn_blocking(move || m.render()).await {
                    Ok(text) => ([("content-type", prometheus::TEXT_FORMAT)], text).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }),
        )
        .with_state((health, metrics))
}

pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: MetricsSlot, mut shutdown: watch::Receiver<bool>) {
    let app = router(health, metrics);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::error!(error = %e, "admin listener failed");
    }
}
