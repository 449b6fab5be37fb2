//! Connections with a send timeout. A client that stops reading (a stalled or malicious
//! streaming client) would otherwise keep its connection, and the events queued for it, for
//! ever: hyper waits on the full socket and has no write timeout of its own. Here a write that
//! makes no progress for `send_timeout` fails; hyper then closes the connection and drops the
//! response body, which ends the SSE producer and so cancels the request at the engine.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// The kernel send buffer of a guarded connection (Linux doubles it): about 25 s of tokens
/// at 50 tokens/s, and far more than any non-streaming answer needs to be in flight.
const SEND_BUFFER_BYTES: usize = 128 * 1024;

/// A TCP listener whose connections fail a write that is stuck for `send_timeout`.
pub struct GuardedListener {
    inner: TcpListener,
    send_timeout: Option<Duration>,
}

impl GuardedListener {
    /// `send_timeout` None: plain connections.
    pub fn new(inner: TcpListener, send_timeout: Option<Duration>) -> GuardedListener {
        GuardedListener {
            inner,
            send_timeout,
        }
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (GuardedStream, SocketAddr) {
        let (s, a) = axum::serve::Listener::accept(&mut self.inner).await;
        (GuardedStream::new(s, self.send_timeout), a)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A TCP stream whose writes fail with `TimedOut` once the socket has accepted no byte for
/// `send_timeout` while a write waits.
pub struct GuardedStream {
    inner: TcpStream,
    send_timeout: Option<Duration>,
    /// Armed when a write first waits; disarmed by any progress.
    stall: Option<Pin<Box<Sleep>>>,
}

impl GuardedStream {
    pub fn new(inner: TcpStream, send_timeout: Option<Duration>) -> GuardedStream {
        // Latency over batching: SSE events are small and a client waits for each.
        let _ = inner.set_nodelay(true);
        if send_timeout.is_some() {
            // The stall clock starts only when the kernel buffer is full, and Linux grows that
            // buffer to megabytes (tcp_wmem): minutes of tokens for a client that reads nothing.
            let _ = socket2::SockRef::from(&inner).set_send_buffer_size(SEND_BUFFER_BYTES);
        }
        GuardedStream {
            inner,
            send_timeout,
            stall: None,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stall = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(limit) = self.send_timeout else {
                    return Poll::Pending;
                };
                let sleep = self
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match sleep.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {limit:?} (send_timeout)"),
                    ))),
                }
            }
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
