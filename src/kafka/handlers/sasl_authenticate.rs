//! SaslAuthenticate: one token of the exchange a SaslHandshake started.
//! A failure is answered SASL_AUTHENTICATION_FAILED with Kafka's message,
//! after `connection_failed_authentication_delay_ms`, and the connection
//! then closes. Versions 1 and up carry the session's lifetime (KIP-368).

use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;
pub use kafka_protocol::messages::{SaslAuthenticateRequest as Request, SaslAuthenticateResponse as Response};

use super::str_bytes;
use crate::kafka::conn;
use crate::kafka::probe::Closed;
use crate::kafka::session::Token;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let session = conn::session();
    let before_auth = session.needs_authentication();
    let answer = session.token(req.auth_bytes.to_vec(), broker.users.clone(), broker.oauth.as_deref(), &broker.engine, broker.cfg.connections_max_reauth_ms, &broker.probe).await;
    let resp = match answer {
        Token::Continue(t) => Response::default().with_auth_bytes(t.into()),
        Token::Done { reply, lifetime_ms } => Response::default().with_auth_bytes(reply.into()).with_session_lifetime_ms(if version >= 1 { lifetime_ms } else { 0 }),
        Token::Failed { code, message } => {
            // An exchange that failed ends the connection; a SaslAuthenticate
            // with no exchange under way (on a plaintext listener, or after
            // authentication) is only refused.
            if code == E::SaslAuthenticationFailed.code() || before_auth {
                tokio::time::sleep(broker.cfg.failed_authentication_delay).await;
                conn::close_after_reply(Closed::AuthFailed);
            }
            Response::default().with_error_code(code).with_error_message(Some(str_bytes(message)))
        }
    };
    broker.probe.error(kafka_protocol::messages::ApiKey::SaslAuthenticate, resp.error_code);
    Some(resp)
}
