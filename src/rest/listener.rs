//! The bridge's HTTP listener: one port for HTTP/1.1 and h2c (cleartext
//! HTTP/2, told apart by the connection preface), or TLS with ALPN, under
//! limits that keep a crowd of idle, slow or greedy clients from holding
//! the broker:
//!
//! - at most `max_connections` open at once; one more is answered `503`
//!   with `Retry-After` and closed, so a client sees why;
//! - a request head (start line and headers) larger than
//!   `max_header_bytes` gets `431`, a URI longer than `max_uri_bytes`
//!   gets `414`;
//! - a head must arrive within `idle_timeout`, and that clock also runs
//!   while a keep-alive connection waits for its next request: a
//!   slow-loris client trickling headers, or an idle one, is closed;
//! - the TLS handshake must finish within `idle_timeout` too.
//!
//! Request bodies have their own deadline (`RestConfig::body_timeout`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use super::RestError;

/// What the listener allows.
#[derive(Clone)]
pub struct ListenerConfig {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub idle_timeout: Duration,
    /// Serve TLS (HTTP/1.1 and h2 by ALPN) instead of cleartext.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig { max_connections: 10_000, max_header_bytes: 16 << 10, max_uri_bytes: 8 << 10, idle_timeout: Duration::from_secs(30), tls: None }
    }
}

impl std::fmt::Debug for ListenerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerConfig")
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("max_uri_bytes", &self.max_uri_bytes)
            .field("idle_timeout", &self.idle_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

pub use crate::probe::ConnectionStats;

/// Loads a PEM certificate chain and private key into a TLS server
/// configuration offering h2 and HTTP/1.1.
pub fn tls_config(cert_file: &std::path::Path, key_file: &std::path::Path) -> anyhow::Result<Arc<tokio_rustls::rustls::ServerConfig>> {
    crate::tls::server_config(&crate::tls::TlsFiles {
        cert: cert_file.into(),
        key: key_file.into(),
        client_auth: crate::tls::ClientAuth::None,
        client_ca: None,
        alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    })
}

/// Serves `app` on `listener` until `shutdown`; then stops accepting and
/// lets open connections finish their requests (the caller bounds how
/// long).
pub async fn serve(listener: TcpListener, app: Router, cfg: ListenerConfig, stats: Arc<ConnectionStats>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.idle_timeout)
        // The head must fit the read buffer: its bound is the head limit
        // (hyper's floor is 8 KiB). Bodies stream through it in chunks.
        .max_buf_size(cfg.max_header_bytes.max(8192))
        .keep_alive(true);
    http.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(cfg.max_header_bytes as u32)
        .keep_alive_interval(Some(cfg.idle_timeout))
        .keep_alive_timeout(cfg.idle_timeout)
        .max_concurrent_streams(256);
    let http = Arc::new(http);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "rest accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let (app, http, cfg, stats) = (app.clone(), http.clone(), cfg.clone(), stats.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            stats.open.fetch_add(1, Ordering::Relaxed);
            let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let app = app.clone();
                let max_uri = cfg.max_uri_bytes;
                // Who is asking, for limits kept per address.
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                async move {
                    let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
                    if uri_len > max_uri {
                        let e = RestError::new(StatusCode::URI_TOO_LONG, 414, format!("the request URI is {uri_len} bytes, over the limit of {max_uri}"));
                        return Ok::<_, std::convert::Infallible>(e.into_response());
                    }
                    app.oneshot(req.map(axum::body::Body::new)).await
                }
            });
            match cfg.tls.clone() {
                None => connection(&http, TokioIo::new(FirstBytes::new(stream, cfg.idle_timeout)), service, watcher, peer).await,
                Some(tls) => match tokio::time::timeout(cfg.idle_timeout, tokio_rustls::TlsAcceptor::from(tls).accept(stream)).await {
                    Ok(Ok(s)) => connection(&http, TokioIo::new(FirstBytes::new(s, cfg.idle_timeout)), service, watcher, peer).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "rest TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "rest TLS handshake timed out"),
                },
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn connection<I, S>(http: &auto::Builder<TokioExecutor>, io: TokioIo<I>, service: S, watcher: hyper_util::server::graceful::Watcher, peer: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = axum::response::Response, Error = std::convert::Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let conn = http.serve_connection_with_upgrades(io, service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, error = %e, "rest connection ended");
    }
}

/// Over the connection limit: say so and close, without reading.
async fn refuse(mut stream: TcpStream) {
    const BODY: &str = r#"{"error_code":50302,"message":"too many connections to the REST listener; retry later"}"#;
    let busy = format!("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}", BODY.len());
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(busy.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Bytes a connection must send within the head timeout: enough to tell
/// HTTP/2's preface from an HTTP/1.1 request line.
const FIRST_BYTES: usize = 24;

/// A connection that must send its first bytes within a deadline: hyper's
/// header timer starts with a request's first byte, and HTTP/2 detection
/// waits for the whole preface, so a client that sends nothing, or part of
/// a preface, would otherwise be held for ever. Past the deadline with
/// fewer than [`FIRST_BYTES`] read, reads fail and the connection closes
/// (a short request answered before then is not affected: its connection
/// is idle by then).
struct FirstBytes<I> {
    inner: I,
    read: usize,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<I> FirstBytes<I> {
    fn new(inner: I, within: Duration) -> FirstBytes<I> {
        FirstBytes { inner, read: 0, deadline: Box::pin(tokio::time::sleep(within)) }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstBytes<I> {
    fn poll_read(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            self.read += buf.filled().len() - before;
        }
        if self.read >= FIRST_BYTES || r.is_ready() {
            return r;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no request head within the idle timeout"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstBytes<I> {
    fn poll_write(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
