//! The REST bridge: HTTP ingestion in the Confluent REST Proxy's shape,
//! appending through the same engine API as Kafka Produce (no second hop
//! through a Kafka client).
//!
//! Served so far: REST Proxy v2 produce (`POST /topics/{topic}`,
//! `POST /topics/{topic}/partitions/{partition}`, JSON and binary embedded
//! formats), the topic listing (`GET /topics`, `GET /topics/{topic}`), and
//! the native bulk endpoint `POST /ingest/{topic}` (see `ingest`).
//! Bodies may be gzip, deflate or zstd; `rest_max_body_bytes` bounds them
//! after decompression. Errors use REST Proxy's envelope
//! `{"error_code": …, "message": …}` and its codes.

mod append;
pub mod body;
mod ingest;
pub mod partition;
mod v2;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::engine::Engine;

/// What the bridge is allowed.
#[derive(Debug, Clone)]
pub struct RestConfig {
    /// Largest request body, after decompression.
    pub max_body_bytes: usize,
}

impl Default for RestConfig {
    fn default() -> Self {
        RestConfig { max_body_bytes: 16 << 20 }
    }
}

/// State the handlers share.
pub struct Bridge {
    pub engine: Arc<Engine>,
    pub cfg: RestConfig,
    /// Keyless records, per bridge (not per topic: good enough to spread).
    pub round_robin: partition::RoundRobin,
}

/// REST Proxy's error envelope.
#[derive(Debug)]
pub struct RestError {
    pub status: StatusCode,
    pub code: u32,
    pub message: String,
}

impl RestError {
    pub fn new(status: StatusCode, code: u32, message: impl Into<String>) -> RestError {
        RestError { status, code, message: message.into() }
    }
    pub fn topic_not_found(topic: &str) -> RestError {
        RestError::new(StatusCode::NOT_FOUND, 40401, format!("Topic {topic} not found."))
    }
    pub fn partition_not_found(p: i32) -> RestError {
        RestError::new(StatusCode::NOT_FOUND, 40402, format!("Partition {p} not found."))
    }
    pub fn unprocessable(message: impl Into<String>) -> RestError {
        RestError::new(StatusCode::UNPROCESSABLE_ENTITY, 42206, message)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error_code": self.code, "message": self.message});
        (self.status, [("content-type", "application/vnd.kafka.v2+json")], body.to_string()).into_response()
    }
}

impl From<body::BodyError> for RestError {
    fn from(e: body::BodyError) -> RestError {
        match e {
            body::BodyError::TooLarge(_) => RestError::new(StatusCode::PAYLOAD_TOO_LARGE, 413, e.to_string()),
            body::BodyError::Encoding(_) => RestError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, 415, e.to_string()),
            body::BodyError::Corrupt(..) | body::BodyError::Read(_) => RestError::new(StatusCode::BAD_REQUEST, 400, e.to_string()),
        }
    }
}

pub fn router(bridge: Arc<Bridge>) -> Router {
    Router::new()
        .route("/topics", get(v2::list_topics))
        .route("/topics/{topic}", get(v2::get_topic).post(v2::produce_topic))
        .route("/topics/{topic}/partitions/{partition}", post(v2::produce_partition))
        .route("/ingest/{*path}", post(ingest::ingest))
        .with_state(bridge)
}

pub async fn serve(listener: TcpListener, bridge: Arc<Bridge>, mut shutdown: watch::Receiver<bool>) {
    let app = router(bridge);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::error!(error = %e, "rest listener failed");
    }
}
