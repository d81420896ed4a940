//! The admin HTTP listener: `/health` (the process is up) and `/ready`
//! (storage is recovered, listeners are bound and the broker is not
//! shutting down). Prometheus `/metrics` joins them here with the
//! observability issue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
}

pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/ready",
            get(|State(h): State<Arc<Health>>| async move {
                if h.ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        )
        .with_state(health)
}

pub async fn serve(listener: TcpListener, health: Arc<Health>, mut shutdown: watch::Receiver<bool>) {
    let app = router(health);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::error!(error = %e, "admin listener failed");
    }
}
