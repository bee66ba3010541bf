//! The connection loop: accepting, per-connection timeouts, and graceful shutdown.
//!
//! Each connection is served by hyper's HTTP/1 implementation under a watchdog that closes
//! it when the client is slow or silent:
//! - **header timeout**: once a client sends the first byte of a request, its headers must
//!   be complete within `header_timeout`;
//! - **idle timeout**: a connection with no request in flight and no bytes arriving is
//!   closed after `idle_timeout`;
//! - the **body timeout** is the body reader's ([`crate::body`]): 408 when a body does not
//!   arrive in time. A request in flight (a long generation) is never timed out.
//!
//! **Shutdown** ([`serve`]'s `shutdown` future completing — the CLI wires SIGTERM and
//! SIGINT to it): the server stops taking work — `/ready` answers 503 and every new request
//! gets 503 with `Connection: close` (the listener stays open during the drain so that a
//! load balancer that has not yet noticed gets a clean, retryable answer); idle keep-alive
//! connections are closed. Requests in flight run on for up to `shutdown_grace`; streams
//! still running then are ended with a final event carrying the finish reason `abort`
//! ([`crate::bridge`]) and requests still waiting get 503. The function returns once
//! nothing is in flight.

use crate::state::{AppState, ServerEvent};
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tower::Service;

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read the listening address: {0}")]
    Io(#[from] io::Error),
    /// The model to preload failed; the server stopped.
    #[error(transparent)]
    Preload(crate::error::ServerError),
}

/// How long streams ended after the grace period get to write their last event, and
/// connections to close once nothing is in flight.
const ABORT_FLUSH: Duration = Duration::from_secs(5);

/// What a connection's watchdog reads: requests in flight and when bytes last arrived.
struct Clock {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` when the connection last became idle.
    idle_since: AtomicU64,
    /// Milliseconds since `epoch` of the first byte of a request not yet handed over.
    head_started: AtomicU64,
    receiving: AtomicBool,
    changed: Notify,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            receiving: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn bytes_arrived(&self) {
        if self.in_flight.load(SeqCst) == 0 && !self.receiving.swap(true, SeqCst) {
            self.head_started.store(self.now_ms(), SeqCst);
            self.changed.notify_one();
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, SeqCst);
        self.receiving.store(false, SeqCst);
        self.changed.notify_one();
    }

    fn request_ended(&self) {
        self.idle_since.store(self.now_ms(), SeqCst);
        self.in_flight.fetch_sub(1, SeqCst);
        self.changed.notify_one();
    }

    /// When the watchdog should close the connection, if nothing changes before.
    fn deadline(&self, limits: &crate::config::Limits) -> Option<Instant> {
        if self.in_flight.load(SeqCst) > 0 {
            return None;
        }
        let at = |ms: u64, d: Duration| self.epoch + Duration::from_millis(ms) + d;
        Some(if self.receiving.load(SeqCst) {
            at(self.head_started.load(SeqCst), limits.header_timeout)
        } else {
            at(self.idle_since.load(SeqCst), limits.idle_timeout)
        })
    }
}

/// The socket, noting when bytes arrive.
struct Watched {
    io: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.clock.bytes_arrived();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A response body that tells the connection's clock when the request is over.
struct Tracked {
    inner: Body,
    clock: Arc<Clock>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.clock.request_ended();
    }
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves one connection until it ends, times out, or finishes draining.
async fn connection(
    stream: TcpStream,
    st: Arc<AppState>,
    router: axum::Router,
    mut drain: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let clock = Arc::new(Clock::new());
    let io = TokioIo::new(Watched {
        io: stream,
        clock: clock.clone(),
    });
    let c = clock.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut router = router.clone();
        let clock = c.clone();
        clock.request_started();
        async move {
            let resp = router.call(req).await;
            resp.map(|r| {
                r.map(|inner| {
                    Body::new(Tracked {
                        inner,
                        clock: clock.clone(),
                    })
                })
            })
        }
    });
    let draining = *drain.borrow();
    let conn = http1::Builder::new()
        .keep_alive(!draining)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    let mut drain_seen = draining;
    loop {
        let deadline = clock.deadline(&st.cfg.limits);
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            () = sleep => {
                if clock.deadline(&st.cfg.limits).is_some_and(|d| d <= Instant::now()) {
                    return;
                }
            }
            () = clock.changed.notified() => {}
            r = drain.changed(), if !drain_seen => {
                drain_seen = true;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Serves on `listener` until `shutdown` completes, then drains (see the module docs).
/// Loads the configured preload model in the background; if it fails, stops and returns
/// the error.
pub async fn serve(
    listener: TcpListener,
    st: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    st.set_bound(listener.local_addr()?);
    let router = crate::router(st.clone());
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    // The preload's error, if it fails (the sender is dropped when it succeeds).
    let (preload_tx, mut preload_rx) = tokio::sync::oneshot::channel();
    if let Some(name) = st.cfg.preload.clone() {
        let st = st.clone();
        tokio::spawn(async move {
            if let Err(e) = st.preload(&name).await {
                let _ = preload_tx.send(e);
            }
        });
    }
    let reaper = {
        let st = st.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                st.clone().reap().await;
            }
        })
    };
    let accept = |conns: &mut JoinSet<()>, r: io::Result<(TcpStream, std::net::SocketAddr)>| {
        // Accept errors (out of descriptors, a reset before accept) concern one client.
        if let Ok((stream, _)) = r {
            conns.spawn(connection(
                stream,
                st.clone(),
                router.clone(),
                drain_rx.clone(),
            ));
        }
    };
    tokio::pin!(shutdown);
    let mut failed = None;
    let mut preload_pending = true;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            r = &mut preload_rx, if preload_pending => {
                preload_pending = false;
                if let Ok(e) = r {
                    failed = Some(e);
                    break;
                }
            }
            r = listener.accept() => accept(&mut conns, r),
            Some(_) = conns.join_next() => {}
        }
    }
    st.life.begin_drain();
    let _ = drain_tx.send(true);
    if failed.is_none() {
        let grace = st.cfg.limits.shutdown_grace;
        st.emit(ServerEvent::Draining {
            in_flight: st.life.in_flight(),
            grace,
        });
        let mut phase_end = tokio::time::Instant::now() + grace;
        let mut aborted = false;
        loop {
            tokio::select! {
                () = st.life.wait_idle() => break,
                () = tokio::time::sleep_until(phase_end) => {
                    if aborted {
                        break;
                    }
                    aborted = true;
                    st.emit(ServerEvent::GraceExpired { in_flight: st.life.in_flight() });
                    st.life.abort_streams();
                    phase_end = tokio::time::Instant::now() + ABORT_FLUSH;
                }
                r = listener.accept() => accept(&mut conns, r),
                Some(_) = conns.join_next() => {}
            }
        }
    }
    drop(listener);
    reaper.abort();
    // Nothing is in flight, but the last bytes of a response may still be on their way out:
    // the connections (keep-alive off) close themselves once written.
    let closed = async { while conns.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(ABORT_FLUSH, closed).await;
    conns.shutdown().await;
    st.emit(ServerEvent::Stopped);
    match failed {
        Some(e) => Err(ServeError::Preload(e)),
        None => Ok(()),
    }
}
