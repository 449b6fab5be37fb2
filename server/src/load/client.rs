//! The HTTP/1.1 test client: responses read as they arrive (Server-Sent Events included,
//! de-chunked), health polling. It speaks only what `strata server` sends; loopback only.

use serde_json::Value;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Status line and headers (names lowercased).
#[derive(Clone, Debug, Default)]
pub struct Head {
    pub status: u16,
    pub headers: HashMap<String, String>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
    pub(super) fn header_u64(&self, name: &str) -> Option<u64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }
}

enum Framing {
    /// In a chunk with this many data bytes left (0: at a size line).
    Chunked {
        left: usize,
        first: bool,
    },
    Length(usize),
    UntilClose,
}

/// A response body, read piece by piece as the server sends it.
pub struct Body {
    sock: TcpStream,
    raw: Vec<u8>,
    framing: Framing,
    done: bool,
}

/// Send one request (`Connection: close`) and read the status line and headers.
pub async fn send(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> io::Result<(Head, Body)> {
    let mut sock = TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let end = loop {
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before the response head"));
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > 1 << 20 {
            return Err(io::Error::other("response head over 1 MiB"));
        }
    };
    let text = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line in {text:?}")))?;
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let framing = if headers.get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        Framing::Chunked { left: 0, first: true }
    } else if let Some(n) = headers.get("content-length").and_then(|v| v.parse().ok()) {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    raw.drain(..end + 4);
    let body = Body { sock, raw, framing, done: false };
    Ok((Head { status, headers }, body))
}

impl Body {
    async fn fill(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 16384];
        let n = self.sock.read(&mut buf).await?;
        self.raw.extend_from_slice(&buf[..n]);
        Ok(n > 0)
    }

    /// The next piece of body data; `None` at the end.
    pub async fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            match &mut self.framing {
                Framing::Length(left) => {
                    if *left == 0 {
                        self.done = true;
                        continue;
                    }
                    if !self.raw.is_empty() {
                        let k = self.raw.len().min(*left);
                        *left -= k;
                        return Ok(Some(self.raw.drain(..k).collect()));
                    }
                }
                Framing::UntilClose => {
                    if !self.raw.is_empty() {
                        return Ok(Some(std::mem::take(&mut self.raw)));
                    }
                }
                Framing::Chunked { left, first } => {
                    if *left > 0 {
                        if !self.raw.is_empty() {
                            let k = self.raw.len().min(*left);
                            *left -= k;
                            return Ok(Some(self.raw.drain(..k).collect()));
                        }
                    } else {
                        // A size line, preceded by the CRLF that ends the previous chunk.
                        let skip = if *first { 0 } else { 2 };
                        if self.raw.len() >= skip
                            && let Some(p) = self.raw[skip..].windows(2).position(|w| w == b"\r\n")
                        {
                            let line = String::from_utf8_lossy(&self.raw[skip..skip + p]);
                            let hex = line.split(';').next().unwrap_or("").trim();
                            let size = usize::from_str_radix(hex, 16)
                                .map_err(|_| io::Error::other(format!("bad chunk size line {line:?}")))?;
                            self.raw.drain(..skip + p + 2);
                            *first = false;
                            if size == 0 {
                                self.done = true;
                            }
                            *left = size;
                            continue;
                        }
                    }
                }
            }
            if !self.fill().await? {
                return match self.framing {
                    Framing::UntilClose => {
                        self.done = true;
                        Ok(None)
                    }
                    _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside the body")),
                };
            }
        }
    }

    /// The rest of the body.
    pub async fn read_all(mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(b) = self.next().await? {
            out.extend_from_slice(&b);
        }
        Ok(out)
    }
}

/// One request, whole body read: (head, body text).
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> io::Result<(Head, String)> {
    let (head, b) = send(addr, method, path, body).await?;
    let bytes = b.read_all().await?;
    Ok((head, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Server-Sent Events from body pieces: `(event name, data)` per event; comments skipped.
#[derive(Default)]
pub struct SseParser {
    buf: String,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(Option<String>, String)> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        let mut out = Vec::new();
        while let Some(p) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..p + 2).collect();
            let (mut name, mut data) = (None, Vec::new());
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = Some(n.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                }
            }
            if name.is_some() || !data.is_empty() {
                out.push((name, data.join("\n")));
            }
        }
        out
    }
}

/// `GET /health` as JSON (any status).
pub async fn health(addr: SocketAddr) -> io::Result<(u16, Value)> {
    let (h, body) = request(addr, "GET", "/health", None).await?;
    Ok((h.status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// Poll `/health` until it answers 200 (the engine is up) or `limit` passes.
pub async fn wait_healthy(addr: SocketAddr, limit: Duration) -> Result<Value, String> {
    let t0 = Instant::now();
    loop {
        let last = match health(addr).await {
            Ok((200, v)) => return Ok(v),
            Ok((s, v)) => format!("{s} {v}"),
            Err(e) => e.to_string(),
        };
        if t0.elapsed() > limit {
            return Err(format!("not healthy within {limit:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
