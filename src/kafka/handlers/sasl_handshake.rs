//! SaslHandshake: the client names a mechanism. The answer lists the
//! mechanisms this listener offers. An unsupported mechanism is answered
//! UNSUPPORTED_SASL_MECHANISM and, before authentication, the connection
//! then closes (Kafka does the same). See `kafka/session.rs` for the
//! states.

use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;
pub use kafka_protocol::messages::{SaslHandshakeRequest as Request, SaslHandshakeResponse as Response};

use super::str_bytes;
use crate::kafka::conn;
use crate::kafka::probe::Closed;
use crate::kafka::session::Handshake;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let session = conn::session();
    let mechanisms = if session.listener.protocol.sasl() { session.listener.mechanisms.iter().map(|m| str_bytes(m.name())).collect() } else { Vec::new() };
    let before_auth = session.needs_authentication();
    let code = match session.handshake(req.mechanism.as_str(), version, broker.cfg.connections_max_reauth_ms) {
        Handshake::Ok => 0,
        Handshake::Unsupported => {
            tracing::info!(peer = %session.peer, listener = %session.listener.name, mechanism = %req.mechanism.as_str(), "SASL mechanism not offered");
            if before_auth {
                conn::close_after_reply(Closed::Unauthenticated);
            }
            E::UnsupportedSaslMechanism.code()
        }
        Handshake::Illegal(why) => {
            tracing::info!(peer = %session.peer, listener = %session.listener.name, why, "SaslHandshake out of turn");
            if before_auth {
                conn::close_after_reply(Closed::Unauthenticated);
            }
            E::IllegalSaslState.code()
        }
    };
    broker.probe.error(kafka_protocol::messages::ApiKey::SaslHandshake, code);
    Some(Response::default().with_error_code(code).with_mechanisms(mechanisms))
}
