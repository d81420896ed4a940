//! ApiVersions: derived from the routing table, so what is advertised is
//! exactly what is served; v3+ also report the feature levels
//! (`kafka::features`).
//!
//! A client asking with a version we do not serve gets, as Kafka answers, a
//! v0 body with UNSUPPORTED_VERSION and our ranges, so it can retry with one
//! we do.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
pub use kafka_protocol::messages::{ApiVersionsRequest as Request, ApiVersionsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::{encode_with_header_version, Route};
use crate::kafka::Broker;
use crate::protocol::header::RequestHeader;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };

fn api_keys() -> Vec<ApiVersion> {
    super::supported()
        .into_iter()
        .map(|(key, v)| ApiVersion::default().with_api_key(key as i16).with_min_version(v.min).with_max_version(v.max))
        .collect()
}

pub fn special(_broker: &Arc<Broker>, h: &RequestHeader, _body: &Bytes) -> Option<Route> {
    if h.api_version >= VERSIONS.min && h.api_version <= VERSIONS.max {
        return None;
    }
    let resp = Response::default().with_error_code(ResponseError::UnsupportedVersion.code()).with_api_keys(api_keys());
    let id = h.correlation_id;
    // ApiVersions responses always use header v0.
    Some(Route::Run(Box::pin(async move { encode_with_header_version(id, 0, 0, &resp) })))
}

pub async fn handle(broker: &Broker, _req: Request, version: i16) -> Option<Response> {
    let f = &broker.cfg.features;
    Some(Response::default().with_api_keys(api_keys()).with_supported_features(f.supported(version)).with_finalized_features_epoch(f.epoch).with_finalized_features(f.finalized()))
}
