//! One client connection: framing, the memory budget, in-order effects,
//! pipelining, and the timers that end connections nobody uses.
//!
//! # Reading
//!
//! The read half takes one frame at a time. Its length is checked against
//! `max_request_bytes`, and its bytes are charged to the broker-wide memory
//! budget (`limits::MemoryBudget`) before the body is read: a connection
//! whose next frame does not fit stops being read until it does. Buffer
//! memory follows the bytes actually received, not the length a client
//! claims. A complete frame's header is parsed by hand and its body goes
//! through the wire-shape guard; whatever fails closes this connection only.
//!
//! # One connection, in order
//!
//! Kafka processes a connection's requests one at a time, and clients rely
//! on it: a commit is visible to the OffsetFetch sent after it on the same
//! connection, a created topic to the next Metadata. Each request therefore
//! starts only once the response of the one before it has been written, with
//! one exception that keeps producers fast: a Produce that follows a Produce
//! starts as soon as the earlier one has handed its batches to the writer
//! (the writer appends them in that order, and both wait for their acks
//! together). Requests are still read ahead, up to
//! `max_in_flight_per_connection`, so a pipelining client loses no round
//! trips.
//!
//! # Writing
//!
//! The write half writes responses in request order. A client that takes
//! nothing of a response for `response_write_timeout` (it stopped reading)
//! has its connection closed, so it cannot hold memory or shutdown; the
//! requests queued behind are stopped, not run.
//!
//! # Idle connections
//!
//! A connection with nothing in flight that sends nothing for
//! `connections_max_idle` (Kafka's `connections.max.idle.ms`) is closed, as
//! is one that leaves a frame half sent that long. A frame larger than the
//! connection's free allowance must arrive within 30 s plus a second per
//! MiB of its length (it holds budget meanwhile).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

mod first_auth;
pub mod throttle;

use first_auth::FirstAuthentication;
use throttle::{ConnQuota, Usage};
use super::handlers::{self, Route};
use super::listener::Listener;
use super::probe::Closed;
use super::session::Session;
use super::Broker;
use crate::auth::KafkaPrincipal;
use crate::limits::{ConnectionBytes, Held, FREE_PER_CONNECTION};
use crate::protocol::{frame, header};

/// Buffer growth step while a large frame arrives: memory follows the bytes
/// actually received, not the length a client claims.
const READ_STEP: usize = 1 << 20;
const READ_MIN: usize = 64 * 1024;
/// Longest a connection that has not authenticated waits for its next
/// bytes (also bounded by `connections_max_idle`).
const BEFORE_AUTH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// After the answer to a failed or refused authentication, how long the
/// connection waits for the client to close it first.
const AFTER_FAILURE_LINGER: std::time::Duration = std::time::Duration::from_secs(1);
/// Responses are written in pieces of this size, each within the write
/// timeout.
const WRITE_CHUNK: usize = 256 * 1024;


/// How long a frame of `len` bytes may take to arrive once its length is
/// read: 30 s, plus a second per MiB (a client sending slower than that
/// holds budget others need). Frames within a connection's free
/// allowance have no such bound; the idle timeout covers them.
fn frame_allowance(len: usize) -> std::time::Duration {
    std::time::Duration::from_secs(30) + std::time::Duration::from_secs_f64(len as f64 / (1 << 20) as f64)
}

/// A request on its way to the write half: the handler's task, its place in
/// the connection's order, and the bytes it holds.
struct Queued {
    task: JoinHandle<Option<Vec<Bytes>>>,
    /// The request may wait long before it answers (a long-poll fetch, a
    /// join or sync parked for its group): what is buffered goes out first.
    parks: bool,
    /// Fired once the response is written: the next request may start.
    written: oneshot::Sender<()>,
    charge: Charge,
}

/// A frame's bytes, counted for this connection and held against the
/// budget until its response is written.
struct Charge {
    conn: Arc<ConnectionBytes>,
    len: usize,
    _held: Held,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.conn.release(self.len);
    }
}

/// Who sent the request a handler is running for (JoinGroup records it for
/// DescribeGroups), and a Produce's place in line.
struct RequestCtx {
    peer: SocketAddr,
    client_id: String,
    order: std::sync::Mutex<Option<ProduceTicket>>,
    ending: Ending,
    session: Arc<Session>,
    /// Set by a handler whose answer is the connection's last (a failed
    /// authentication): the writer closes once it is written.
    last_reply: Arc<AtomicBool>,
    /// The connection's quotas and throttle, and this request's charges
    /// (`None`: no quota was configured when it started).
    quota: Arc<ConnQuota>,
    usage: Option<Usage>,
}

/// Why the connection ends, decided once by whoever sees it first (the
/// reader, the writer, or a handler that finds its request malformed).
type Ending = Arc<std::sync::OnceLock<Closed>>;

/// Marks the running request's connection to close, for `why` (the
/// handler then answers `None`).
pub fn closing(why: Closed) {
    let _ = REQUEST.try_with(|c| c.ending.set(why));
}

/// Marks the running request's answer as the connection's last: it is
/// written, then the connection closes, for `why`.
pub fn close_after_reply(why: Closed) {
    let _ = REQUEST.try_with(|c| {
        let _ = c.ending.set(why);
        c.last_reply.store(true, Ordering::Release);
    });
}

/// The running request's connection: its listener, principal and SASL
/// state. Outside a connection (the fuzz target), an anonymous plaintext
/// session.
pub fn session() -> Arc<Session> {
    static DETACHED: std::sync::LazyLock<Arc<Session>> = std::sync::LazyLock::new(|| Arc::new(Session::detached()));
    REQUEST.try_with(|c| c.session.clone()).unwrap_or_else(|_| DETACHED.clone())
}

/// The address clients of the running request's listener are given
/// (Metadata, FindCoordinator, DescribeCluster): each listener advertises
/// its own, as in Kafka. Outside a connection, the broker's first.
pub fn advertised(broker: &Broker) -> (String, i32) {
    REQUEST
        .try_with(|c| (c.session.listener.advertised_host.clone(), c.session.listener.advertised_port))
        .unwrap_or_else(|_| (broker.cfg.advertised_host.clone(), broker.cfg.advertised_port))
}

/// The name of the running request's listener (`None` outside a
/// connection).
pub fn listener_name() -> Option<String> {
    REQUEST.try_with(|c| c.session.listener.name.clone()).ok()
}

/// Held by a running Produce until it has handed its batches to the writer;
/// dropping it lets the next Produce of the connection start.
pub struct ProduceTicket {
    submitted: Option<oneshot::Sender<()>>,
}

impl Drop for ProduceTicket {
    fn drop(&mut self) {
        // Sent, not just dropped: a dropped sender means the request never
        // ran (its connection is ending), and the next one does not run.
        if let Some(s) = self.submitted.take() {
            let _ = s.send(());
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

/// The order requests take effect in: what the next one waits for.
#[derive(Default)]
struct Order {
    /// Fires when the last request's response is written (or its task is
    /// gone).
    last_written: Option<oneshot::Receiver<()>>,
    /// Fires when the last request, if a Produce, has submitted its batches.
    last_submitted: Option<oneshot::Receiver<()>>,
}

impl Order {
    /// What request `is_produce` waits for before it starts, and the
    /// signals it leaves for the next one.
    fn next(&mut self, is_produce: bool) -> (Option<oneshot::Receiver<()>>, oneshot::Sender<()>, Option<ProduceTicket>) {
        let after_produce = self.last_submitted.take();
        let wait = match (is_produce, after_produce) {
            (true, Some(submitted)) => Some(submitted),
            _ => self.last_written.take(),
        };
        let (written, written_rx) = oneshot::channel();
        self.last_written = Some(written_rx);
        let ticket = is_produce.then(|| {
            let (submitted, submitted_rx) = oneshot::channel();
            self.last_submitted = Some(submitted_rx);
            ProduceTicket { submitted: Some(submitted) }
        });
        (wait, written, ticket)
    }
}

/// A stream the connection loop can split into halves it reads and
/// writes from two tasks. Plain TCP splits for free; TLS shares its state
/// between the halves.
pub trait Halves: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Read: AsyncRead + Unpin + Send + 'static;
    type Write: AsyncWrite + Unpin + Send + 'static;
    fn halves(self) -> (Self::Read, Self::Write);
}

impl Halves for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
}

impl Halves for tokio_rustls::server::TlsStream<TcpStream> {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    fn halves(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
}

/// Serves one accepted connection of `listener`: the TLS handshake if the
/// listener has TLS, SASL authentication if it has SASL, then requests.
pub async fn run(stream: TcpStream, peer: SocketAddr, broker: Arc<Broker>, listener: Arc<Listener>, shutdown: watch::Receiver<bool>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let Some(tls) = listener.tls.clone() else {
        let session = Arc::new(Session::new(listener, peer, KafkaPrincipal::anonymous()));
        return serve(stream, peer, broker, session, shutdown).await;
    };
    // The handshake is bounded like an idle connection: a client that
    // opens a socket and says nothing holds a descriptor only so long.
    let stream = match tokio::time::timeout(broker.cfg.connections_max_idle.min(std::time::Duration::from_secs(30)), tls.acceptor().accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, listener = %listener.name, error = %e, "TLS handshake failed");
            broker.probe.closed(Closed::TlsHandshake);
            return Ok(());
        }
        Err(_) => {
            tracing::debug!(%peer, listener = %listener.name, "TLS handshake timed out");
            broker.probe.closed(Closed::TlsHandshake);
            return Ok(());
        }
    };
    // A verified client certificate names the principal (Kafka's default
    // principal builder: the subject's distinguished name, through
    // `ssl_principal_mapping_rules`; a name no rule maps is refused).
    // On SASL_SSL the SASL exchange names the principal; the certificate
    // is not mapped (as in Kafka).
    let dn = if listener.protocol.sasl() { None } else { stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| crate::tls::subject_dn(c)) };
    let principal = match dn {
        None => KafkaPrincipal::anonymous(),
        Some(dn) => match listener.principal_mapping.map(&dn) {
            Some(name) => KafkaPrincipal::user(name),
            None => {
                tracing::info!(%peer, listener = %listener.name, subject = %dn, "closing connection: no ssl_principal_mapping_rules rule maps the certificate's subject");
                broker.probe.closed(Closed::AuthFailed);
                let mut stream = stream;
                let _ = tokio::time::timeout(broker.cfg.response_write_timeout, stream.shutdown()).await;
                return Ok(());
            }
        },
    };
    let session = Arc::new(Session::new(listener, peer, principal));
    serve(stream, peer, broker, session, shutdown).await
}

async fn serve<S: Halves>(mut stream: S, peer: SocketAddr, broker: Arc<Broker>, session: Arc<Session>, mut shutdown: watch::Receiver<bool>) -> io::Result<()> {
    let ending: Ending = Default::default();
    let last_reply = Arc::new(AtomicBool::new(false));
    let mut buf = BytesMut::with_capacity(READ_MIN);
    let quota = Arc::new(ConnQuota::new(broker.quotas.clone(), broker.probe.clone()));
    if session.needs_authentication() {
        let first = FirstAuthentication { broker: &broker, session: &session, peer, ending: &ending, last_reply: &last_reply, quota: &quota };
        if let Err(why) = first.run(&mut stream, &mut buf, &mut shutdown).await {
            if last_reply.load(Ordering::Acquire) {
                // The failure was answered: the client is given a moment
                // to read it and close first. Some (kafka-python over TLS)
                // drop an answer that arrives with the end of the stream.
                let mut sink = [0u8; 1024];
                let _ = tokio::time::timeout(AFTER_FAILURE_LINGER, async {
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
            }
            // An orderly close: TLS close_notify, then FIN.
            let _ = tokio::time::timeout(broker.cfg.response_write_timeout, stream.shutdown()).await;
            broker.probe.closed(why);
            return Ok(());
        }
    }
    let (mut rd, wr) = stream.halves();
    let (tx, rx) = mpsc::channel::<Queued>(broker.cfg.max_in_flight_per_connection.max(1));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut writer = tokio::spawn(write_loop(wr, rx, broker.clone(), in_flight.clone(), peer, ending.clone(), last_reply.clone()));
    let max = broker.cfg.max_request_bytes;
    let conn_bytes = Arc::new(ConnectionBytes::default());
    let mut order = Order::default();
    // The budget's hold for the frame at the head of `buf`, once its length
    // is known, and when its body must be in.
    let mut head: Option<(usize, Held)> = None;
    let idle = broker.cfg.connections_max_idle;
    // One timer for both limits, moved only when a limit comes nearer (a
    // large frame) or when it fires: re-arming a timer for every read
    // would cost more than many requests do.
    let mut last_read = tokio::time::Instant::now();
    let mut frame_due: Option<tokio::time::Instant> = None;
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    let close = |why: Closed| {
        let _ = ending.set(why);
    };
    let mut writer_result = None;
    let mut read_error = None;
    'read: loop {
        // Every complete frame in the buffer, in order.
        loop {
            let len = match frame::peek_length(&buf, max) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                    close(Closed::BadFrame);
                    break 'read;
                }
            };
            if head.is_none() {
                let charge = conn_bytes.charge_for(len);
                // Most frames fit the connection's allowance or the budget
                // at once; only a wait is raced against shutdown.
                let held = match broker.budget.try_acquire_quiet(charge) {
                    Some(h) => h,
                    None => tokio::select! {
                        h = broker.budget.acquire(charge) => h,
                        _ = shutdown.changed() => { close(Closed::Shutdown); break 'read }
                    },
                };
                conn_bytes.add(len);
                head = Some((len, held));
                // Only a frame beyond the free allowance holds budget.
                if len > FREE_PER_CONNECTION {
                    let due = tokio::time::Instant::now() + frame_allowance(len);
                    frame_due = Some(due);
                    if due < timer.deadline() {
                        timer.as_mut().reset(due);
                    }
                }
            }
            if buf.len() < frame::LENGTH_BYTES + len {
                break;
            }
            let (len, held) = head.take().expect("charged above");
            frame_due = None;
            let charge = Charge { conn: conn_bytes.clone(), len, _held: held };
            let mut frame = buf.split_to(frame::LENGTH_BYTES + len).freeze();
            let _ = frame.split_to(frame::LENGTH_BYTES);
            let conn = Conn { peer, ending: &ending, session: &session, last_reply: &last_reply, quota: &quota };
            match dispatch(&broker, &conn, frame, &mut order) {
                Ok((task, parks, written)) => {
                    in_flight.fetch_add(1, Ordering::AcqRel);
                    if tx.send(Queued { task, parks, written, charge }).await.is_err() {
                        break 'read;
                    }
                }
                Err(why) => {
                    close(why);
                    break 'read;
                }
            }
        }
        let needed = head.as_ref().map_or(READ_MIN, |(len, _)| (frame::LENGTH_BYTES + len).saturating_sub(buf.len()));
        if buf.capacity() - buf.len() < READ_MIN.min(needed).max(1) {
            buf.reserve(needed.clamp(READ_MIN, READ_STEP));
        }
        tokio::select! {
            n = rd.read_buf(&mut buf) => match n {
                Ok(0) => break,
                Ok(_) => last_read = tokio::time::Instant::now(),
                Err(e) => { read_error = Some(e); break }
            },
            _ = shutdown.changed() => { close(Closed::Shutdown); break }
            // The writer ended (a failed handler, a write timeout): so
            // does the connection.
            w = &mut writer => { writer_result = Some(w); break }
            () = &mut timer => {
                let now = tokio::time::Instant::now();
                // A frame that holds budget must keep coming: a client
                // that announces a large request and trickles it cannot
                // sit on the budget.
                if frame_due.is_some_and(|due| now >= due) {
                    tracing::warn!(%peer, "closing connection: a request body arrived too slowly");
                    close(Closed::SlowRequest);
                    break;
                }
                // Nothing arrived for the idle limit: close if nothing is
                // in flight (a half-sent frame counts as nothing).
                if now >= last_read + idle && in_flight.load(Ordering::Acquire) == 0 {
                    tracing::debug!(%peer, idle_ms = idle.as_millis() as u64, "closing idle connection");
                    close(Closed::Idle);
                    break;
                }
                let next = (last_read + idle).max(now + idle.min(std::time::Duration::from_secs(1)));
                timer.as_mut().reset(frame_due.map_or(next, |due| due.min(next)));
            }
        }
    }
    drop(tx);
    let result = match writer_result {
        Some(w) => w,
        None => writer.await,
    };
    broker.probe.closed(ending.get().copied().unwrap_or(Closed::Client));
    if let Some(e) = read_error {
        return Err(e);
    }
    result.unwrap_or_else(|e| Err(io::Error::other(e)))
}

/// A started request: its task, whether it may park, and the signal its
/// written response fires.
type Dispatched = (JoinHandle<Option<Vec<Bytes>>>, bool, oneshot::Sender<()>);

/// What every request of a connection shares.
struct Conn<'a> {
    peer: SocketAddr,
    ending: &'a Ending,
    session: &'a Arc<Session>,
    last_reply: &'a Arc<AtomicBool>,
    quota: &'a Arc<ConnQuota>,
}

/// Parses the header and starts the handler, to run once the requests
/// before it allow (and the connection's throttle, if any, has passed).
/// `Err` closes the connection, for that reason.
fn dispatch(broker: &Arc<Broker>, conn: &Conn<'_>, frame: Bytes, order: &mut Order) -> Result<Dispatched, Closed> {
    let Conn { peer, ending, session, last_reply, quota } = *conn;
    let h = match header::parse(&frame) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: bad request header");
            return Err(Closed::BadHeader);
        }
    };
    // An expired SASL session may only re-authenticate (KIP-368).
    use kafka_protocol::messages::ApiKey;
    if !matches!(h.api_key, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) && session.expired(std::time::Instant::now()) {
        tracing::info!(%peer, listener = %session.listener.name, principal = %session.principal(), api = ?h.api_key, "closing connection: its SASL session expired");
        return Err(Closed::SessionExpired);
    }
    let body = frame.slice(h.len..);
    match handlers::route(broker, &h, body) {
        Route::Run(fut) => {
            let is_produce = h.api_key == kafka_protocol::messages::ApiKey::Produce;
            let (wait, written, ticket) = order.next(is_produce);
            // ApiVersions and the SASL exchange are not charged for their
            // time, as in Kafka.
            let exempt = matches!(h.api_key, ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate);
            let usage = broker.quotas.any().then(|| Usage::new(exempt));
            let timed_polls = usage.is_some();
            let ctx = RequestCtx {
                peer,
                client_id: h.client_id.clone().unwrap_or_default(),
                order: std::sync::Mutex::new(ticket),
                ending: ending.clone(),
                session: session.clone(),
                last_reply: last_reply.clone(),
                quota: quota.clone(),
                usage,
            };
            let (probe, api, version) = (broker.probe.clone(), h.api_key, h.api_version);
            let span = tracing::debug_span!("request", api = ?api, version, correlation_id = h.correlation_id, %peer);
            let started = std::time::Instant::now();
            let muted = quota.clone();
            let timed = async move {
                if let Some(w) = wait {
                    // The request before this one was written (or, for a
                    // Produce after a Produce, submitted). A dropped sender
                    // means it never was: the writer stopped, the
                    // connection is ending, and this request does not run
                    // (Kafka would never have read it).
                    w.await.ok()?;
                }
                // A quota's throttle holds the connection's next request.
                muted.wait_muted().await;
                let reply = fut.await;
                probe.answered(api, version, started);
                reply
            };
            let parks = matches!(api, ApiKey::Fetch | ApiKey::JoinGroup | ApiKey::SyncGroup);
            // Timed only when a quota is configured: otherwise the handler
            // runs as it did before quotas existed.
            let task = if timed_polls {
                tokio::spawn(tracing::Instrument::instrument(REQUEST.scope(ctx, throttle::Timed::new(timed)), span))
            } else {
                tokio::spawn(tracing::Instrument::instrument(REQUEST.scope(ctx, timed), span))
            };
            Ok((task, parks, written))
        }
        Route::Close(why, reason) => {
            tracing::warn!(%peer, api = ?h.api_key, version = h.api_version, client = ?h.client_id,
                reason = %why, "closing connection");
            Err(reason)
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(wr: W, mut rx: mpsc::Receiver<Queued>, broker: Arc<Broker>, in_flight: Arc<AtomicUsize>, peer: SocketAddr, ending: Ending, last_reply: Arc<AtomicBool>) -> io::Result<()> {
    let result = write_responses(wr, &mut rx, &broker, &in_flight, peer, &ending, &last_reply).await;
    // Whatever is still queued will not be answered: stop it (a request
    // waiting for its turn would not run anyway; one running is cut short)
    // and give its bytes back.
    rx.close();
    while let Ok(q) = rx.try_recv() {
        q.task.abort();
        in_flight.fetch_sub(1, Ordering::AcqRel);
    }
    result
}

async fn write_responses<W: AsyncWrite + Unpin>(wr: W, rx: &mut mpsc::Receiver<Queued>, broker: &Broker, in_flight: &AtomicUsize, peer: SocketAddr, ending: &Ending, last_reply: &AtomicBool) -> io::Result<()> {
    let timeout = broker.cfg.response_write_timeout;
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    let timed_out = |what: &str| {
        tracing::warn!(%peer, timeout_ms = timeout.as_millis() as u64, "closing connection: the client took nothing of a {what} in time");
        let _ = ending.set(Closed::WriteTimeout);
        io::Error::new(io::ErrorKind::TimedOut, "response write timed out")
    };
    while let Some(Queued { mut task, parks, written, charge }) = rx.recv().await {
        // Responses ready together leave together (one write for many,
        // flushed when nothing more is queued); but before waiting on a
        // request that may park, what is buffered goes out: the client may
        // be waiting for it.
        if parks && !task.is_finished() && !wr.buffer().is_empty() {
            tokio::time::timeout(timeout, wr.flush()).await.map_err(|_| timed_out("flush"))??;
        }
        let parts = match (&mut task).await {
            Ok(Some(parts)) => parts,
            // The handler could not answer (or an acks=0 produce failed):
            // close rather than leave the client waiting.
            Ok(None) => break,
            Err(e) => {
                tracing::error!(error = %e, "request handler failed; closing connection");
                break;
            }
        };
        // The bound is on progress, not on the whole response: a large
        // fetch over a slow link is fine while the client keeps reading.
        for part in &parts {
            for chunk in part.chunks(WRITE_CHUNK) {
                tokio::time::timeout(timeout, wr.write_all(chunk)).await.map_err(|_| timed_out("response"))??;
            }
        }
        let last = last_reply.load(Ordering::Acquire);
        if rx.is_empty() || last {
            tokio::time::timeout(timeout, wr.flush()).await.map_err(|_| timed_out("flush"))??;
        }
        if last {
            // The answer was the connection's last (a failed
            // authentication): nothing queued behind it runs.
            break;
        }
        drop(parts);
        drop(charge);
        in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = written.send(());
    }
    tokio::time::timeout(timeout, wr.flush()).await.map_err(|_| timed_out("flush"))??;
    let _ = tokio::time::timeout(timeout, wr.into_inner().shutdown()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_wait_for_the_one_before_except_produce_after_produce() {
        let mut o = Order::default();
        let (w1, written1, t1) = o.next(false);
        assert!(w1.is_none() && t1.is_none(), "the first request starts at once");
        let (w2, written2, t2) = o.next(true);
        let mut w2 = w2.expect("a produce after a metadata waits for its response");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), &mut w2).await.is_err());
        let _ = written1.send(());
        w2.await.unwrap();
        let (w3, _written3, _t3) = o.next(true);
        let mut w3 = w3.expect("a produce after a produce waits for its submission");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), &mut w3).await.is_err());
        drop(t2);
        assert!(w3.await.is_ok(), "released when the first produce's ticket drops");
        let (w4, _, _) = o.next(false);
        let mut w4 = w4.expect("a fetch after a produce waits for its response");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), &mut w4).await.is_err());
        drop(written2);
        // written3 is what w4 waits on, not written2.
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), &mut w4).await.is_err());
        drop(_written3);
        assert!(w4.await.is_err(), "a request whose predecessor was never written does not run");
    }
}
