//! The first authentication of a SASL listener's connection, before the
//! connection is pipelined (see `session.rs` for the states).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::throttle::ConnQuota;
use super::{frame_allowance, Ending, RequestCtx, BEFORE_AUTH_WAIT, READ_MIN, REQUEST};
use crate::kafka::handlers::{self, Route};
use crate::kafka::probe::Closed;
use crate::kafka::session::{Session, Token};
use crate::kafka::Broker;
use crate::limits::{Held, FREE_PER_CONNECTION};
use crate::protocol::{frame, header};

/// A SASL listener's connection before it has authenticated: requests
/// are read and answered one at a time, and only ApiVersions,
/// SaslHandshake and SaslAuthenticate are served (anything else closes
/// the connection, as in Kafka). Frames are bounded by
/// `sasl_max_receive_bytes` and charged to the memory budget; each must
/// arrive within the idle limit. After a version 0 handshake the tokens
/// come and go without Kafka headers.
pub(super) struct FirstAuthentication<'a> {
    pub(super) broker: &'a Arc<Broker>,
    pub(super) session: &'a Arc<Session>,
    pub(super) peer: SocketAddr,
    pub(super) ending: &'a Ending,
    pub(super) last_reply: &'a Arc<AtomicBool>,
    /// The connection's quotas (nothing is charged before authentication:
    /// only exempt APIs run).
    pub(super) quota: &'a Arc<ConnQuota>,
}

impl FirstAuthentication<'_> {
    pub(super) async fn run<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: &mut S, buf: &mut BytesMut, shutdown: &mut watch::Receiver<bool>) -> Result<(), Closed> {
        use kafka_protocol::messages::ApiKey;
        let (broker, peer) = (self.broker, self.peer);
        let write_timeout = broker.cfg.response_write_timeout;
        while self.session.needs_authentication() {
            let raw = self.session.expects_raw_token();
            let (frame, _held) = self.next_frame(stream, buf, raw, shutdown).await?;
            if raw {
                let token = self.session.token(frame.to_vec(), broker.users.clone(), broker.oauth.as_deref(), &broker.engine, broker.cfg.connections_max_reauth_ms, &broker.probe).await;
                let reply = match token {
                    Token::Continue(t) => t,
                    Token::Done { reply, .. } => reply,
                    // Before SaslAuthenticate there was no way to say why:
                    // the connection closes.
                    Token::Failed { .. } => {
                        tokio::time::sleep(broker.cfg.failed_authentication_delay).await;
                        return Err(Closed::AuthFailed);
                    }
                };
                let mut out = Vec::with_capacity(4 + reply.len());
                out.extend_from_slice(&(reply.len() as i32).to_be_bytes());
                out.extend_from_slice(&reply);
                tokio::time::timeout(write_timeout, stream.write_all(&out)).await.map_err(|_| Closed::WriteTimeout)?.map_err(|_| Closed::Client)?;
                continue;
            }
            let h = header::parse(&frame).map_err(|e| {
                tracing::warn!(%peer, error = %e, "closing connection: bad request header");
                Closed::BadHeader
            })?;
            if !matches!(h.api_key, ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) {
                tracing::info!(%peer, listener = %self.session.listener.name, api = ?h.api_key, "closing connection: a request before SASL authentication");
                return Err(Closed::Unauthenticated);
            }
            let fut = match handlers::route(broker, &h, frame.slice(h.len..)) {
                Route::Run(fut) => fut,
                Route::Close(why, reason) => {
                    tracing::warn!(%peer, api = ?h.api_key, version = h.api_version, reason = %why, "closing connection");
                    return Err(reason);
                }
            };
            let ctx = RequestCtx {
                peer,
                client_id: h.client_id.clone().unwrap_or_default(),
                order: std::sync::Mutex::new(None),
                ending: self.ending.clone(),
                session: self.session.clone(),
                last_reply: self.last_reply.clone(),
                quota: self.quota.clone(),
                usage: None,
            };
            let started = std::time::Instant::now();
            let parts = REQUEST.scope(ctx, fut).await.ok_or(Closed::BadBody)?;
            broker.probe.answered(h.api_key, h.api_version, started);
            for part in &parts {
                tokio::time::timeout(write_timeout, stream.write_all(part)).await.map_err(|_| Closed::WriteTimeout)?.map_err(|_| Closed::Client)?;
            }
            tokio::time::timeout(write_timeout, stream.flush()).await.map_err(|_| Closed::WriteTimeout)?.map_err(|_| Closed::Client)?;
            if self.last_reply.load(Ordering::Acquire) {
                return Err(self.ending.get().copied().unwrap_or(Closed::AuthFailed));
            }
        }
        Ok(())
    }

    /// The next whole frame (a raw token if `raw`), without its length, and
    /// the budget it holds. An unauthenticated client has no claim on the
    /// shared budget: a frame past the connection's free allowance takes
    /// budget only if it is free at once (else the connection closes), and
    /// must arrive within the slow-frame allowance; every read waits at
    /// most [`BEFORE_AUTH_WAIT`].
    async fn next_frame<S: AsyncRead + Unpin>(&self, stream: &mut S, buf: &mut BytesMut, raw: bool, shutdown: &mut watch::Receiver<bool>) -> Result<(Bytes, Held), Closed> {
        let max = self.broker.cfg.sasl_max_receive_bytes;
        let wait = self.broker.cfg.connections_max_idle.min(BEFORE_AUTH_WAIT);
        let mut held: Option<Held> = None;
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            let peeked = if raw { frame::peek_token_length(buf, max) } else { frame::peek_length(buf, max) };
            match peeked {
                Ok(Some(len)) => {
                    if held.is_none() {
                        let Some(h) = self.broker.budget.try_acquire_quiet(len.saturating_sub(FREE_PER_CONNECTION)) else {
                            tracing::warn!(peer = %self.peer, len, "closing connection: no request budget free for a frame before authentication");
                            return Err(Closed::Unauthenticated);
                        };
                        held = Some(h);
                        if len > FREE_PER_CONNECTION {
                            due = Some(tokio::time::Instant::now() + frame_allowance(len));
                        }
                    }
                    if buf.len() >= frame::LENGTH_BYTES + len {
                        let mut f = buf.split_to(frame::LENGTH_BYTES + len).freeze();
                        let _ = f.split_to(frame::LENGTH_BYTES);
                        return Ok((f, held.expect("acquired above")));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(peer = %self.peer, error = %e, "closing connection: bad frame before authentication");
                    return Err(Closed::BadFrame);
                }
            }
            if buf.capacity() - buf.len() < READ_MIN {
                buf.reserve(READ_MIN);
            }
            let until = due.map_or(tokio::time::Instant::now() + wait, |d| d.min(tokio::time::Instant::now() + wait));
            tokio::select! {
                n = tokio::time::timeout_at(until, stream.read_buf(buf)) => match n {
                    Ok(Ok(0)) | Ok(Err(_)) => return Err(Closed::Client),
                    Ok(Ok(_)) => {}
                    Err(_) if due.is_some_and(|d| tokio::time::Instant::now() >= d) => return Err(Closed::SlowRequest),
                    Err(_) => return Err(Closed::Idle),
                },
                _ = shutdown.changed() => return Err(Closed::Shutdown),
            }
        }
    }
}
