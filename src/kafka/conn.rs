//! One client connection: framing, pipelining, ordered responses.
//!
//! The read half parses frames and hands each request to its handler as a
//! spawned task; the task's handle goes into a bounded queue of
//! `max_in_flight_per_connection`. The write half awaits those handles in
//! queue order, so responses leave in request order however the handlers
//! interleave, and a client that pipelines more than the bound simply stops
//! being read (TCP backpressure) until earlier responses are written.
//!
//! Malformed input never reaches a decoder unchecked: the frame length is
//! checked against `max_request_bytes` before any buffer grows for it, the
//! header is parsed by hand, and the body goes through the wire-shape guard.
//! Whatever fails closes this connection only.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::handlers::{self, Route};
use super::Broker;
use crate::protocol::{frame, header};

/// Buffer growth step while a large frame arrives: memory follows the bytes
/// actually received, not the length a client claims.
const READ_STEP: usize = 1 << 20;
const READ_MIN: usize = 64 * 1024;

type InFlight = JoinHandle<Option<Vec<Bytes>>>;

/// Who sent the request a handler is running for (JoinGroup records it for
/// DescribeGroups).
struct RequestCtx {
    peer: SocketAddr,
    client_id: String,
    order: std::sync::Mutex<Option<ProduceTicket>>,
}

/// Keeps pipelined Produce requests of one connection in order: each waits
/// for the one before it to have queued its appends before queuing its own
/// (Kafka appends a connection's produce requests in request order; with
/// handlers running as separate tasks, a large request could otherwise be
/// overtaken by a small one behind it). Dropping the ticket releases the
/// next request.
pub struct ProduceTicket {
    prev: Option<tokio::sync::oneshot::Receiver<()>>,
    _done: tokio::sync::oneshot::Sender<()>,
}

impl ProduceTicket {
    /// Waits until the previous Produce request on the connection has
    /// submitted its appends (or is gone).
    pub async fn wait_turn(&mut self) {
        if let Some(prev) = self.prev.take() {
            let _ = prev.await;
        }
    }
}

/// The running Produce request's ticket, once.
pub fn take_produce_ticket() -> Option<ProduceTicket> {
    REQUEST.try_with(|c| c.order.lock().expect("ticket lock").take()).ok().flatten()
}

tokio::task_local! {
    static REQUEST: RequestCtx;
}

/// The requesting client's host, as Kafka reports it (`/<ip>`).
pub fn peer_host() -> String {
    REQUEST.try_with(|c| format!("/{}", c.peer.ip())).unwrap_or_default()
}

/// The requesting client's id from the request header.
pub fn client_id() -> String {
    REQUEST.try_with(|c| c.client_id.clone()).unwrap_or_default()
}

pub async fn run(stream: TcpStream, peer: SocketAddr, broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<InFlight>(broker.cfg.max_in_flight_per_connection.max(1));
    let writer = tokio::spawn(write_loop(wr, rx));
    let max = broker.cfg.max_request_bytes;
    let mut buf = BytesMut::with_capacity(READ_MIN);
    let mut last_produce = None;
    'read: loop {
        loop {
            match frame::check(&buf, max) {
                Ok(Some(len)) => {
                    let mut frame = buf.split_to(frame::LENGTH_BYTES + len).freeze();
                    let _ = frame.split_to(frame::LENGTH_BYTES);
                    match dispatch(&broker, peer, frame, &mut last_produce) {
                        Some(task) => {
                            if tx.send(task).await.is_err() {
                                break 'read;
                            }
                        }
                        None => break 'read,
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                    break 'read;
                }
            }
        }
        let needed = match frame::peek_length(&buf, max) {
            Ok(Some(len)) => (frame::LENGTH_BYTES + len).saturating_sub(buf.len()),
            _ => READ_MIN,
        };
        if buf.capacity() - buf.len() < READ_MIN.min(needed).max(1) {
            buf.reserve(needed.clamp(READ_MIN, READ_STEP));
        }
        tokio::select! {
            n = rd.read_buf(&mut buf) => match n {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => { drop(tx); let _ = writer.await; return Err(e) }
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(tx);
    writer.await.unwrap_or_else(|e| Err(io::Error::other(e)))
}

/// Parses the header and starts the handler. `None` closes the connection.
fn dispatch(broker: &Arc<Broker>, peer: SocketAddr, frame: Bytes, last_produce: &mut Option<tokio::sync::oneshot::Receiver<()>>) -> Option<InFlight> {
    let h = match header::parse(&frame) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: bad request header");
            return None;
        }
    };
    let body = frame.slice(h.len..);
    match handlers::route(broker, &h, body) {
        Route::Run(fut) => {
            let order = (h.api_key == kafka_protocol::messages::ApiKey::Produce).then(|| {
                let (done, next) = tokio::sync::oneshot::channel();
                ProduceTicket { prev: last_produce.replace(next), _done: done }
            });
            let ctx = RequestCtx { peer, client_id: h.client_id.clone().unwrap_or_default(), order: std::sync::Mutex::new(order) };
            let (probe, api, version, started) = (broker.probe.clone(), h.api_key, h.api_version, std::time::Instant::now());
            let span = tracing::debug_span!("request", api = ?api, version, correlation_id = h.correlation_id, %peer);
            let timed = async move {
                let reply = fut.await;
                probe.answered(api, version, started);
                reply
            };
            Some(tokio::spawn(tracing::Instrument::instrument(REQUEST.scope(ctx, timed), span)))
        }
        Route::Close(why) => {
            tracing::warn!(%peer, api = ?h.api_key, version = h.api_version, client = ?h.client_id,
                reason = %why, "closing connection");
            None
        }
    }
}

async fn write_loop(wr: OwnedWriteHalf, mut rx: mpsc::Receiver<InFlight>) -> io::Result<()> {
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    while let Some(task) = rx.recv().await {
        match task.await {
            Ok(Some(parts)) => {
                for part in parts {
                    wr.write_all(&part).await?;
                }
            }
            // The handler could not answer (or an acks=0 produce failed):
            // close rather than leave the client waiting.
            Ok(None) => break,
            Err(e) => {
                tracing::error!(error = %e, "request handler failed; closing connection");
                break;
            }
        }
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.flush().await?;
    wr.into_inner().shutdown().await
}
