//! The admin HTTP listener: `/health` (the process is up), `/ready`
//! (storage is recovered and not poisoned, listeners are bound and the
//! broker is not shutting down) and `/metrics` (Prometheus text format).
//!
//! Subsystems report through probes they define and are handed
//! (`engine::probe`, `kafka::probe`, `rest::probe`): atomics and
//! lock-free histograms, made once. State that already exists (offsets,
//! the tip, compaction counters, group commits) is read when Prometheus
//! scrapes, never kept twice. See `scrape` for the names.

mod scrape;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub use scrape::{Limits, Metrics};

#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
}

/// Set once the engine is open; until then `/metrics` shows only the
/// build, `canopy_ready 0` and the process.
pub type MetricsSlot = Arc<std::sync::OnceLock<Arc<Metrics>>>;

pub fn router(health: Arc<Health>, metrics: MetricsSlot) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route(
            "/ready",
            get(|State((h, m)): State<(Arc<Health>, MetricsSlot)>| async move {
                if let Some(why) = m.get().and_then(|m| m.poisoned()) {
                    return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: writes are refused: {why}\n"));
                }
                if h.ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready\n".to_owned())
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned())
                }
            }),
        )
        .route(
            "/metrics",
            get(|State((h, m)): State<(Arc<Health>, MetricsSlot)>| async move {
                // The scrape reads the catalog (group commits) and /proc: off the async threads.
                let render = move || match m.get() {
                    Some(m) => m.render(),
                    None => scrape::recovering(&h),
                };
                match tokio::task::spawn_blocking(render).await {
                    Ok(text) => ([("content-type", prometheus::TEXT_FORMAT)], text).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }),
        )
        .with_state((health, metrics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: &Router, path: &str) -> (StatusCode, String) {
        let r = app.clone().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn while_recovering_the_scrape_says_not_ready() {
        let health = Arc::new(Health::default());
        let app = router(health.clone(), MetricsSlot::default());
        assert_eq!(get(&app, "/health").await, (StatusCode::OK, "ok\n".to_owned()));
        assert_eq!(get(&app, "/ready").await.0, StatusCode::SERVICE_UNAVAILABLE);
        let (status, text) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.lines().any(|l| l == "canopy_ready 0"), "{text}");
        assert!(text.contains("canopy_build_info{version="), "{text}");
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
        assert!(!text.contains("canopy_records_in_total"), "no engine state before the engine is open");
        assert_eq!(get(&app, "/nowhere").await.0, StatusCode::NOT_FOUND);
    }
}
