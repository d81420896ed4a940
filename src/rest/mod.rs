//! The REST bridge: HTTP ingestion in the Confluent REST Proxy's shape,
//! appending through the same engine API as Kafka Produce (no second hop
//! through a Kafka client).
//!
//! Served so far: REST Proxy v2 produce (`POST /topics/{topic}`,
//! `POST /topics/{topic}/partitions/{partition}`, JSON and binary embedded
//! formats), the topic listing (`GET /topics`, `GET /topics/{topic}`), and
//! the native bulk endpoint `POST /ingest/{topic}` (see `ingest`), and
//! REST Proxy v3 records (single, streaming, batch) with the cluster and
//! topic listings (see `v3`).
//! Bodies may be gzip, deflate or zstd; `rest_max_body_bytes` bounds them
//! after decompression. Errors use REST Proxy's envelope
//! `{"error_code": …, "message": …}` and its codes.

mod append;
pub mod body;
mod ingest;
pub mod partition;
mod v2;
mod v3;

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{Credential, Principals};
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
    /// Who may produce where; empty: no authentication.
    pub principals: Arc<Principals>,
}

impl Bridge {
    pub fn new(engine: Arc<Engine>, cfg: RestConfig, principals: Arc<Principals>) -> Bridge {
        Bridge { engine, cfg, round_robin: Default::default(), principals }
    }

    /// Checks the request's credentials (`Authorization: Bearer …`,
    /// `Authorization: Basic …` or `X-API-Key: …`) and, for a produce, that
    /// the principal may write `topic`: 401 without or with wrong
    /// credentials, 403 outside its topics. Called before the body is read,
    /// so a refused request writes nothing.
    pub fn authorize(&self, headers: &HeaderMap, topic: Option<&str>) -> Result<(), RestError> {
        if self.principals.is_empty() {
            return Ok(());
        }
        let unauthorized = |why: &str| RestError::new(StatusCode::UNAUTHORIZED, 40101, why.to_owned());
        let auth = headers.get("authorization").map(|v| v.as_bytes());
        let basic;
        let credential = match (auth, headers.get("x-api-key")) {
            (Some(a), _) if a.len() > 7 && a[..7].eq_ignore_ascii_case(b"bearer ") => Credential::Token(a[7..].trim_ascii()),
            (Some(a), _) if a.len() > 6 && a[..6].eq_ignore_ascii_case(b"basic ") => {
                use base64::Engine as _;
                basic = base64::engine::general_purpose::STANDARD.decode(a[6..].trim_ascii()).map_err(|_| unauthorized("malformed Basic credentials"))?;
                let colon = basic.iter().position(|&c| c == b':').ok_or_else(|| unauthorized("malformed Basic credentials"))?;
                let user = std::str::from_utf8(&basic[..colon]).map_err(|_| unauthorized("malformed Basic credentials"))?;
                Credential::Password { user, password: &basic[colon + 1..] }
            }
            (Some(_), _) => return Err(unauthorized("unsupported Authorization scheme (Bearer or Basic)")),
            (None, Some(k)) => Credential::Token(k.as_bytes()),
            (None, None) => return Err(unauthorized("authentication required")),
        };
        let principal = self.principals.authenticate(&credential).ok_or_else(|| unauthorized("invalid credentials"))?;
        match topic {
            Some(t) if !principal.may_produce(t) => Err(RestError::new(StatusCode::FORBIDDEN, 40301, format!("{} may not produce to {t}", principal.name))),
            _ => Ok(()),
        }
    }
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
        let mut r = (self.status, [("content-type", "application/vnd.kafka.v2+json")], body.to_string()).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("Basic realm=\"canopy\", Bearer"));
        }
        r
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
        .route("/v3/clusters", get(v3::clusters))
        .route("/v3/clusters/{cluster}/topics", get(v3::topics))
        .route("/v3/clusters/{cluster}/topics/{topic}/records", post(v3::records))
        .route("/v3/clusters/{cluster}/topics/{topic}/records:batch", post(v3::batch))
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
