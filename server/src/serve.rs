//! Serving connections: hyper's HTTP/1 server with the limits a client connection lives under
//! ([`ConnLimits`]): a send timeout and a cap on the connections of one client address
//! ([`crate::net`]), a header read timeout (hyper's own `header_read_timeout`) and a body read
//! timeout ([`body_deadline`]). Without them a client that sends a byte every few seconds
//! (slowloris) holds its connection, and a task, for ever.
//!
//! axum's `serve` builds hyper's connection without a timer, so hyper's header timeout cannot
//! be switched on there; this is the same accept loop with it.

use crate::net::GuardedListener;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Default `header_timeout` (seconds).
pub const DEFAULT_HEADER_TIMEOUT: u64 = 10;
/// Default `body_timeout` (seconds).
pub const DEFAULT_BODY_TIMEOUT: u64 = 60;
/// Default `max_connections_per_client`.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// What a client connection may take (each `None`: no limit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnLimits {
    /// A response write that makes no progress this long closes the connection.
    pub send_timeout: Option<Duration>,
    /// A request head (and the wait for one on an idle keep-alive connection) must be in
    /// within this; else the connection is closed without an answer.
    pub header_timeout: Option<Duration>,
    /// A request body must be in within this from its head; else 408 and the connection is
    /// closed.
    pub body_timeout: Option<Duration>,
    /// Open connections per client IP address; more are answered 429 and closed.
    pub max_connections_per_client: Option<usize>,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            send_timeout: Some(Duration::from_secs(crate::config::DEFAULT_SEND_TIMEOUT)),
            header_timeout: Some(Duration::from_secs(DEFAULT_HEADER_TIMEOUT)),
            body_timeout: Some(Duration::from_secs(DEFAULT_BODY_TIMEOUT)),
            max_connections_per_client: Some(DEFAULT_MAX_CONNECTIONS_PER_CLIENT),
        }
    }
}

/// Serve `router` on `listener` under `limits` until `shutdown` completes, then let the open
/// connections finish their requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut listener =
        GuardedListener::new(listener, limits.send_timeout).with_client_cap(limits.max_connections_per_client);
    let router = match limits.body_timeout {
        None => router,
        Some(t) => router.layer(axum::middleware::from_fn(move |req: Request, next: Next| body_deadline(t, req, next))),
    };
    let (close_tx, close_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            (stream, _) = axum::serve::Listener::accept(&mut listener) => stream,
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let mut close = close_rx.clone();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                // Errors here are the client's doing (a reset, a timeout): nothing to report.
                _ = conn.as_mut() => return,
                _ = close.changed() => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
            drop(close);
        });
    }
    drop(listener);
    drop(close_rx);
    let _ = close_tx.send(());
    close_tx.closed().await;
}

/// A request body that fails with [`BodyTimedOut`] once `deadline` passes before its end.
struct DeadlineBody {
    inner: Body,
    limit: Duration,
    /// `None`: too far to represent, so never.
    deadline: Option<Instant>,
    /// Armed on the first poll that waits for data.
    sleep: Option<Pin<Box<Sleep>>>,
}

/// The error a request body read past `body_timeout` fails with; [`crate::error::read_body`]
/// answers it with 408.
#[derive(Debug)]
pub struct BodyTimedOut(pub Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} s (body_timeout)", self.0.as_secs_f64())
    }
}

impl std::error::Error for BodyTimedOut {}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(deadline) = this.deadline else {
            return Poll::Pending;
        };
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Gives the request's body `limit` from now to arrive in full.
async fn body_deadline(limit: Duration, req: Request, next: Next) -> Response {
    let deadline = Instant::now().checked_add(limit);
    let req = req.map(|inner| Body::new(DeadlineBody { inner, limit, deadline, sleep: None }));
    next.run(req).await
}
