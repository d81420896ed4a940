//! A connection's security state: the listener it came through, who it
//! is, and where its SASL exchange stands.
//!
//! ```text
//!              SaslHandshake(mech)         SaslAuthenticate (more)
//!  Initial ─────────────────────► Handshaken ───────┐
//!     ▲                               │  ▲──────────┘
//!     │ (SASL listener: nothing       │ SaslAuthenticate (last): principal set,
//!     │  but ApiVersions and SASL     ▼ session lifetime starts
//!     │  before Complete)         Complete ──SaslHandshake(same mech)──► Handshaken (re-authentication)
//! ```
//!
//! Authentication runs before the connection is pipelined (see
//! `conn.rs`), so the first exchange sees requests one at a time.
//! Re-authentication (KIP-368) runs through the ordinary request path: a
//! request starts only once the one before it was answered, so the
//! handshake and its authenticate requests are seen in order too.
//!
//! A failed exchange is answered after `connection_failed_authentication_delay_ms`
//! and the connection is then closed, as Kafka does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::auth::oauth::Validator;
use crate::auth::sasl::{Exchange, Outcome, SaslMechanism};
use crate::auth::users::UserStore;
use crate::auth::KafkaPrincipal;
use kafka_protocol::ResponseError as E;
use crate::kafka::listener::Listener;

pub struct Session {
    pub listener: Arc<Listener>,
    pub peer: SocketAddr,
    principal: RwLock<Arc<KafkaPrincipal>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A handshake is done and its exchange waits for tokens.
    exchange: Option<Exchange>,
    /// The handshake's version: 0 means the tokens that follow are raw
    /// (no Kafka header), as before SaslAuthenticate existed.
    handshake_version: i16,
    /// The mechanism of the completed authentication; re-authentication
    /// must use the same.
    mechanism: Option<SaslMechanism>,
    authenticated: bool,
    /// When the session ends (re-authentication due), if it does.
    expires: Option<Instant>,
}

/// The answer to a SaslHandshake.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    Ok,
    /// UNSUPPORTED_SASL_MECHANISM; the connection closes after the answer.
    Unsupported,
    /// ILLEGAL_SASL_STATE, with why.
    Illegal(&'static str),
}

/// The answer to one SASL token.
#[derive(Debug, PartialEq, Eq)]
pub enum Token {
    /// Send this token; more are expected.
    Continue(Vec<u8>),
    /// Authenticated: send this token; the session lasts `lifetime_ms`
    /// (0: for ever).
    Done { reply: Vec<u8>, lifetime_ms: i64 },
    /// Refused with this error code and message; the connection closes
    /// after the answer (and the failure delay).
    Failed { code: i16, message: String },
}

impl Session {
    pub fn new(listener: Arc<Listener>, peer: SocketAddr, principal: KafkaPrincipal) -> Session {
        Session { listener, peer, principal: RwLock::new(Arc::new(principal)), state: Mutex::default() }
    }

    /// A session outside any listener (the fuzz target, handler tests).
    pub fn detached() -> Session {
        Session::new(Arc::new(Listener::plaintext("127.0.0.1", 0)), SocketAddr::from(([127, 0, 0, 1], 0)), KafkaPrincipal::anonymous())
    }

    pub fn principal(&self) -> Arc<KafkaPrincipal> {
        self.principal.read().expect("principal lock").clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("session lock")
    }

    /// Must this connection still authenticate before anything else?
    pub fn needs_authentication(&self) -> bool {
        self.listener.protocol.sasl() && !self.state().authenticated
    }

    /// Has the SASL session ended? (Then only re-authentication may
    /// follow.)
    pub fn expired(&self, now: Instant) -> bool {
        self.state().expires.is_some_and(|e| now >= e)
    }

    /// Tokens that follow a version 0 handshake come without a Kafka
    /// header.
    pub fn expects_raw_token(&self) -> bool {
        let s = self.state();
        s.exchange.is_some() && s.handshake_version == 0
    }

    pub fn handshake(&self, mechanism: &str, version: i16, reauth_ms: i64) -> Handshake {
        if !self.listener.protocol.sasl() {
            return Handshake::Illegal("SASL is not offered on this listener");
        }
        let mut s = self.state();
        if s.exchange.is_some() {
            return Handshake::Illegal("a SASL handshake is already under way");
        }
        let Some(mech) = SaslMechanism::from_name(mechanism).filter(|m| self.listener.mechanisms.contains(m)) else {
            return Handshake::Unsupported;
        };
        if s.authenticated {
            // Re-authentication: offered only when sessions expire, with
            // the mechanism of the first authentication.
            // (A session ends when re-authentication is on, or when its
            // credential expires: an OAUTHBEARER token.)
            if (reauth_ms == 0 && s.expires.is_none()) || version == 0 {
                return Handshake::Illegal("re-authentication is not enabled on this listener");
            }
            if s.mechanism != Some(mech) {
                return Handshake::Illegal("re-authentication must use the mechanism of the first authentication");
            }
        }
        s.exchange = Some(Exchange::new(mech));
        s.handshake_version = version;
        Handshake::Ok
    }

    /// One token of the exchange a handshake started. PLAIN's PBKDF2 runs
    /// on the broker's CPU pool.
    pub async fn token(&self, token: Vec<u8>, users: Arc<UserStore>, oauth: Option<&Validator>, engine: &crate::engine::Engine, reauth_ms: i64, probe: &super::probe::KafkaProbe) -> Token {
        let Some(mut exchange) = self.state().exchange.take() else {
            return Token::Failed { code: E::IllegalSaslState.code(), message: "SaslAuthenticate before SaslHandshake".into() };
        };
        let mech = exchange.mechanism();
        let step = if mech.is_slow() {
            match engine.run_cpu(move || (exchange.step(&token, &users, None), exchange)).await {
                Some((step, ex)) => {
                    exchange = ex;
                    step
                }
                None => return Token::Failed { code: E::SaslAuthenticationFailed.code(), message: "Authentication failed: the broker is shutting down".into() },
            }
        } else {
            exchange.step(&token, &users, oauth)
        };
        let listener = self.listener.name.as_str();
        match step {
            Ok(Outcome::Continue(reply)) => {
                self.state().exchange = Some(exchange);
                Token::Continue(reply)
            }
            Ok(Outcome::Done { user, reply, expires_s }) => {
                let principal = KafkaPrincipal::user(user);
                let mut s = self.state();
                let reauth = s.authenticated;
                if reauth && *self.principal() != principal {
                    probe.authenticated(listener, mech.name(), "failure");
                    tracing::warn!(peer = %self.peer, listener, mechanism = %mech, from = %self.principal(), to = %principal, "re-authentication tried to change the principal");
                    return Token::Failed { code: E::SaslAuthenticationFailed.code(), message: format!("Cannot change principals during re-authentication from {}: {principal}", self.principal()) };
                }
                // A credential that expires (an OAUTHBEARER token) ends the
                // session no later than itself, with re-authentication on
                // or off, as in Kafka.
                let lifetime_ms = match expires_s {
                    Some(exp) => {
                        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
                        let left = (exp.min(i64::MAX as u64 / 1000) as i64 * 1000).saturating_sub(now_ms).max(1);
                        if reauth_ms > 0 { reauth_ms.min(left) } else { left }
                    }
                    None => reauth_ms,
                };
                s.authenticated = true;
                s.mechanism = Some(mech);
                s.expires = (lifetime_ms > 0).then(|| Instant::now() + Duration::from_millis(lifetime_ms as u64));
                drop(s);
                tracing::debug!(peer = %self.peer, listener, mechanism = %mech, %principal, reauth, "authenticated");
                *self.principal.write().expect("principal lock") = Arc::new(principal);
                probe.authenticated(listener, mech.name(), if reauth { "reauthentication" } else { "success" });
                Token::Done { reply, lifetime_ms }
            }
            Err(e) => {
                probe.authenticated(listener, mech.name(), "failure");
                // The reason is logged, never the token (it may hold a password).
                tracing::info!(peer = %self.peer, listener, mechanism = %mech, reason = %e, "authentication failed");
                Token::Failed { code: E::SaslAuthenticationFailed.code(), message: e.client_message(mech) }
            }
        }
    }
}
