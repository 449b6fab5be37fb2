//! Connections with a send timeout. A client that stops reading (a stalled or malicious
//! streaming client) would otherwise keep its connection, and the events queued for it, for
//! ever: hyper waits on the full socket and has no write timeout of its own. Here a write that
//! makes no progress for `send_timeout` fails; hyper then closes the connection and drops the
//! response body, which ends the SSE producer and so cancels the request at the engine.
//!
//! The listener also caps the open connections of one client IP address: one client cannot
//! take all the server's sockets and tasks (slowloris); a connection over the cap gets a 429
//! and is closed, and the other clients are served as before.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

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
    clients: Option<Arc<Clients>>,
}

/// Open connections per client address, under a cap.
struct Clients {
    cap: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection of `ip`; uncounted when the connection is dropped.
pub struct ClientSlot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Clients {
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(ClientSlot { clients: self.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Answer a connection over the cap with a 429 and close it, in the background: the client's
/// request is read (at most 64 KiB, for at most 1 s) so that the close is not a reset that
/// would discard the answer before the client reads it.
fn refuse(mut s: TcpStream, ip: IpAddr, cap: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let message = format!(
        "too many connections from {ip}: at most {cap} at once per client address \
         (max_connections_per_client); close some or retry later"
    );
    let body = serde_json::json!({"error": {"message": message, "type": "rate_limit_error",
        "param": null, "code": "too_many_connections"}})
    .to_string();
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            s.write_all(answer.as_bytes()).await?;
            s.shutdown().await?;
            let mut buf = [0u8; 4096];
            let mut read = 0;
            while read < 64 << 10 {
                match s.read(&mut buf).await? {
                    0 => break,
                    n => read += n,
                }
            }
            Ok::<_, io::Error>(())
        })
        .await;
    });
}

impl GuardedListener {
    /// `send_timeout` None: plain connections.
    pub fn new(inner: TcpListener, send_timeout: Option<Duration>) -> GuardedListener {
        GuardedListener { inner, send_timeout, clients: None }
    }

    /// At most `cap` open connections per client IP address (`None`: no cap).
    pub fn with_client_cap(mut self, cap: Option<usize>) -> GuardedListener {
        self.clients = cap.map(|cap| Arc::new(Clients { cap, open: Mutex::new(HashMap::new()) }));
        self
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (GuardedStream, SocketAddr) {
        loop {
            let (s, a) = axum::serve::Listener::accept(&mut self.inner).await;
            let slot = match &self.clients {
                None => None,
                Some(c) => match c.enter(a.ip()) {
                    Some(slot) => Some(slot),
                    None => {
                        refuse(s, a.ip(), c.cap);
                        continue;
                    }
                },
            };
            let mut stream = GuardedStream::new(s, self.send_timeout);
            stream.slot = slot;
            return (stream, a);
        }
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
    /// The connection's place under the per-client cap.
    slot: Option<ClientSlot>,
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
        GuardedStream { inner, send_timeout, stall: None, slot: None }
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
                let sleep = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
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
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
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
