//! Load and fault testing of `strata server` (docs/reliability.md): a small HTTP/1.1
//! client that reads responses as they arrive (Server-Sent Events included, de-chunked, with
//! the time of the first token), the request mix of the load test, the load runner with its
//! checks (no failed request, service in arrival order, RSS flat after warm-up), and helpers to
//! run `strata server` as a child process and to sample a process's RSS.
//!
//! The client speaks only what `strata server` sends (HTTP/1.1, `Connection: close`, chunked
//! or sized bodies); it is test tooling, not a general HTTP client. Loopback only.

use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{self, BufRead};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------------
// HTTP client

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
    fn header_u64(&self, name: &str) -> Option<u64> {
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
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<(Head, Body)> {
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
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the response head",
            ));
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
    let framing = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        Framing::Chunked {
            left: 0,
            first: true,
        }
    } else if let Some(n) = headers.get("content-length").and_then(|v| v.parse().ok()) {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    raw.drain(..end + 4);
    let body = Body {
        sock,
        raw,
        framing,
        done: false,
    };
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
                            let size = usize::from_str_radix(hex, 16).map_err(|_| {
                                io::Error::other(format!("bad chunk size line {line:?}"))
                            })?;
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
                    _ => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside the body",
                    )),
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
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<(Head, String)> {
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

// ---------------------------------------------------------------------------------------------
// One request of the load test

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
    /// `/v1/messages`
    Messages,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completion => "/v1/completions",
            Api::Messages => "/v1/messages",
        }
    }
}

/// What to send.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    pub api: Api,
    pub stream: bool,
    /// Hang up after the first text delta (streaming only).
    pub cancel: bool,
    pub max_tokens: u32,
    pub prompt: String,
    pub seed: u64,
}

impl Spec {
    pub fn body(&self) -> Value {
        let messages = json!([{"role": "user", "content": self.prompt}]);
        let mut b = match self.api {
            Api::Chat => json!({"messages": messages}),
            Api::Completion => json!({"prompt": self.prompt}),
            Api::Messages => json!({"messages": messages}),
        };
        b["max_tokens"] = self.max_tokens.into();
        b["stream"] = self.stream.into();
        b["temperature"] = json!(0.7);
        b["seed"] = self.seed.into();
        if self.stream && self.api != Api::Messages {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    }
}

/// What happened. Times are in ms since the load test's start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    pub client: usize,
    pub seq: usize,
    pub api: Option<Api>,
    pub stream: bool,
    pub cancel: bool,
    pub sent_ms: f64,
    pub head_ms: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub end_ms: f64,
    pub status: u16,
    /// Completed as the API promises (or hung up by us after its first token, `cancel`).
    pub ok: bool,
    /// We hung up after the first token as planned.
    pub cancelled: bool,
    pub error: Option<String>,
    /// From `usage` when the answer completed; text deltas received when cancelled.
    pub tokens: u32,
    pub text_deltas: u32,
    /// `x-strata-request-id`, `x-strata-queued-us`, `x-strata-started-us`.
    pub queue: Option<(u64, u64, u64)>,
    /// `timings.predicted_per_second` (OpenAI endpoints).
    pub decode_tps: Option<f64>,
    /// The error event or body, when the answer was an error.
    pub error_body: Option<Value>,
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// Send `spec` and follow its answer to the end (or to the planned hang-up).
pub async fn run_one(addr: SocketAddr, spec: &Spec, t0: Instant) -> Outcome {
    run_one_notify(addr, spec, t0, None).await
}

/// [`run_one`], telling `first` when the first text delta arrives (fault tests inject their
/// fault mid-stream).
pub async fn run_one_notify(
    addr: SocketAddr,
    spec: &Spec,
    t0: Instant,
    first: Option<tokio::sync::oneshot::Sender<()>>,
) -> Outcome {
    let mut o = Outcome {
        api: Some(spec.api),
        stream: spec.stream,
        cancel: spec.cancel,
        sent_ms: ms(t0),
        ..Default::default()
    };
    let body = spec.body().to_string();
    let res = follow(addr, spec, &body, t0, &mut o, first).await;
    o.end_ms = ms(t0);
    if let Err(e) = res {
        o.ok = false;
        o.error = Some(e);
    }
    o
}

async fn follow(
    addr: SocketAddr,
    spec: &Spec,
    body: &str,
    t0: Instant,
    o: &mut Outcome,
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), String> {
    let (head, mut b) = send(addr, "POST", spec.api.path(), Some(body))
        .await
        .map_err(|e| format!("request: {e}"))?;
    o.head_ms = Some(ms(t0));
    o.status = head.status;
    if let (Some(id), Some(q), Some(s)) = (
        head.header_u64("x-strata-request-id"),
        head.header_u64("x-strata-queued-us"),
        head.header_u64("x-strata-started-us"),
    ) {
        o.queue = Some((id, q, s));
    }
    let sse = head
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if head.status != 200 || !sse {
        let bytes = b.read_all().await.map_err(|e| format!("body: {e}"))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "status {} body not JSON ({e}): {}",
                head.status,
                String::from_utf8_lossy(&bytes)
            )
        })?;
        if head.status != 200 {
            o.error_body = Some(v.clone());
            return Err(format!("status {}: {v}", head.status));
        }
        if spec.stream {
            return Err(format!("asked to stream, got JSON: {v}"));
        }
        o.first_token_ms = Some(ms(t0));
        let usage = &v["usage"];
        o.tokens = usage["completion_tokens"]
            .as_u64()
            .or(usage["output_tokens"].as_u64())
            .ok_or_else(|| format!("no usage in {v}"))? as u32;
        o.decode_tps = v["timings"]["predicted_per_second"].as_f64();
        o.ok = true;
        return Ok(());
    }
    let mut parser = SseParser::default();
    let mut finished = false;
    loop {
        let piece = match b.next().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => return Err(format!("stream: {e}")),
        };
        for (name, data) in parser.push(&piece) {
            if finished {
                return Err(format!("data after the end of the stream: {data}"));
            }
            let mut text = false;
            if spec.api == Api::Messages {
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| format!("event data not JSON ({e}): {data}"))?;
                match name.as_deref().unwrap_or("") {
                    "content_block_delta" => text = true,
                    "message_delta" => {
                        o.tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0) as u32
                    }
                    "message_stop" => finished = true,
                    "error" => {
                        o.error_body = Some(v.clone());
                        return Err(format!("error event: {v}"));
                    }
                    _ => {}
                }
            } else if data == "[DONE]" {
                finished = true;
            } else {
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| format!("chunk not JSON ({e}): {data}"))?;
                if v.get("error").is_some() {
                    o.error_body = Some(v.clone());
                    return Err(format!("error chunk: {v}"));
                }
                let c = &v["choices"][0];
                let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
                text = piece.is_some_and(|p| !p.is_empty());
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    o.tokens = n as u32;
                }
                if let Some(t) = v["timings"]["predicted_per_second"].as_f64() {
                    o.decode_tps = Some(t);
                }
            }
            if text {
                o.text_deltas += 1;
                o.first_token_ms.get_or_insert_with(|| ms(t0));
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
                if spec.cancel {
                    // Hang up mid-stream: the connection is dropped with `b`.
                    o.cancelled = true;
                    o.ok = true;
                    o.tokens = o.text_deltas;
                    return Ok(());
                }
            }
        }
    }
    if !finished {
        return Err("stream ended without its final event".into());
    }
    o.ok = true;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The load test

const CHAT_PROMPTS: &[&str] = &[
    "Write a haiku about the sea.",
    "What is a linked list? One sentence.",
    "Name three prime numbers.",
    "Explain recursion to a child in one sentence.",
    "Give me a short name for a cat.",
    "What does HTTP stand for?",
    "Say hello in French and in Spanish.",
    "Write one line of Python that prints the numbers 1 to 5.",
];
const CODE_PROMPTS: &[&str] = &[
    "def fibonacci(n):",
    "// A function that reverses a string in C\nchar *reverse(char *s) {",
    "fn main() {\n    let v = vec![3, 1, 2];",
    "SELECT name FROM users WHERE",
    "import numpy as np\n\ndef normalize(x):",
    "#include <stdio.h>\nint main(void) {",
];

/// The `seq`-th request of client `client`: the APIs, streaming or not, and planned hang-ups
/// rotate so every client sends every kind and neighbours send different kinds at once.
pub fn spec_for(client: usize, seq: usize, max_tokens: u32, cancel_every: usize) -> Spec {
    let k = client * 7 + seq;
    let (api, stream) = match k % 6 {
        0 => (Api::Chat, true),
        1 => (Api::Completion, false),
        2 => (Api::Messages, true),
        3 => (Api::Chat, false),
        4 => (Api::Completion, true),
        _ => (Api::Messages, false),
    };
    // A client's requests alternate between streaming and not: seq / 2 counts its streams.
    let cancel =
        stream && cancel_every > 0 && (client + seq / 2) % cancel_every == cancel_every - 1;
    let prompt = match api {
        Api::Completion => CODE_PROMPTS[k % CODE_PROMPTS.len()],
        _ => CHAT_PROMPTS[k % CHAT_PROMPTS.len()],
    };
    let lo = (max_tokens / 2).max(1);
    Spec {
        api,
        stream,
        cancel,
        max_tokens: lo + (k as u32 % (max_tokens - lo + 1)),
        prompt: prompt.to_string(),
        seed: k as u64,
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub addr: SocketAddr,
    pub clients: usize,
    /// Clients start requests for this long, then finish the ones in flight.
    pub duration: Duration,
    /// RSS samples before this are warm-up (not in first/last/growth).
    pub warmup: Duration,
    /// Largest `max_tokens` (requests use max/2 ..= max).
    pub max_tokens: u32,
    /// Every n-th streaming request of a client hangs up after its first token (0: none).
    pub cancel_every: usize,
    /// The server's pid, for its RSS (the engine's comes from `/health`).
    pub server_pid: Option<u32>,
    /// One request's limit (queueing included).
    pub request_timeout: Duration,
    /// A request sent this long after another was answered has to be served after it.
    pub order_slack: Duration,
    /// Largest allowed RSS growth from the first sample after warm-up to the last, per process.
    pub rss_growth_limit_kb: u64,
    pub rss_interval: Duration,
}

impl LoadOptions {
    pub fn new(addr: SocketAddr, clients: usize, duration: Duration) -> LoadOptions {
        LoadOptions {
            addr,
            clients,
            duration,
            warmup: (duration / 6).min(Duration::from_secs(30)),
            max_tokens: 16,
            cancel_every: 4,
            server_pid: None,
            request_timeout: Duration::from_secs(60) + Duration::from_secs(8) * clients as u32,
            order_slack: Duration::from_millis(100),
            rss_growth_limit_kb: 32 << 10,
            rss_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RssSample {
    pub t_s: f64,
    /// VmRSS.
    pub server_kb: Option<u64>,
    pub engine_kb: Option<u64>,
    /// RssAnon: the heap and stacks, what a leak grows (VmRSS also counts the pages of the
    /// memory-mapped model that decoding has touched so far).
    pub server_anon_kb: Option<u64>,
    pub engine_anon_kb: Option<u64>,
    pub engine_pid: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RssSummary {
    pub first_kb: u64,
    pub last_kb: u64,
    pub peak_kb: u64,
    /// Least-squares slope over the samples after warm-up.
    pub slope_kb_per_min: f64,
    pub samples: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    fn of(mut v: Vec<f64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        // Nearest rank.
        let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles {
            n: v.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: v[v.len() - 1],
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct OrderCheck {
    /// Requests with queue headers.
    pub requests: usize,
    /// Served (protocol id order) before a request that entered the queue more than the slack
    /// earlier (server clock): must be 0.
    pub server_inversions: usize,
    /// Such inversions within the slack (threads racing to the queue): reported only.
    pub server_inversions_within_slack: usize,
    /// `x-strata-started-us` not increasing with the id: must be 0.
    pub start_inversions: usize,
    /// A request sent more than the slack after another one was served before it (client
    /// clock): must be 0.
    pub client_inversions: usize,
    pub slack_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub duration_s: f64,
    pub wall_s: f64,
    pub requests: usize,
    pub completed: usize,
    pub cancelled: usize,
    pub failed: usize,
    pub failures: Vec<String>,
    pub by_kind: Vec<(String, usize)>,
    /// Streaming requests: request sent → first text delta (queueing included).
    pub ttft: Percentiles,
    /// Queue wait at the server (`started - queued`).
    pub queue_wait: Percentiles,
    /// Request sent → last byte, completed requests.
    pub latency: Percentiles,
    pub tokens: u64,
    /// All requests' tokens over the wall time from the first request to the last answer.
    pub tokens_per_s: f64,
    /// Mean of the engine's own decode rate (`timings.predicted_per_second`).
    pub decode_tps_mean: f64,
    pub order: OrderCheck,
    pub server_rss: Option<RssSummary>,
    pub engine_rss: Option<RssSummary>,
    pub server_anon: Option<RssSummary>,
    pub engine_anon: Option<RssSummary>,
    pub engine_pids: Vec<u32>,
    pub rss_growth_limit_kb: u64,
    pub rss: Vec<RssSample>,
    pub passed: bool,
    pub verdict: Vec<String>,
}

/// VmRSS of a process in KiB (None if it is gone).
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// RssAnon of a process in KiB.
pub fn rss_anon_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "RssAnon:")
}

fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn summarize_rss(v: &[(f64, u64)]) -> Option<RssSummary> {
    let (first, last) = (v.first()?.1, v.last()?.1);
    let n = v.len() as f64;
    let (mt, mk) = (
        v.iter().map(|s| s.0).sum::<f64>() / n,
        v.iter().map(|s| s.1 as f64).sum::<f64>() / n,
    );
    let (mut num, mut den) = (0.0, 0.0);
    for &(t, k) in v {
        num += (t - mt) * (k as f64 - mk);
        den += (t - mt) * (t - mt);
    }
    Some(RssSummary {
        first_kb: first,
        last_kb: last,
        peak_kb: v.iter().map(|s| s.1).max().unwrap_or(0),
        slope_kb_per_min: if den > 0.0 { num / den * 60.0 } else { 0.0 },
        samples: v.len(),
    })
}

/// Run the load test.
pub async fn run_load(opts: &LoadOptions) -> LoadReport {
    let t0 = Instant::now();
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, addr, server_pid, every) = (
            stop_sampling.clone(),
            opts.addr,
            opts.server_pid,
            opts.rss_interval,
        );
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let engine_pid = match health(addr).await {
                    Ok((_, v)) => v["engine_pid"].as_u64().map(|p| p as u32),
                    Err(_) => None,
                };
                samples.push(RssSample {
                    t_s: t0.elapsed().as_secs_f64(),
                    server_kb: server_pid.and_then(rss_kb),
                    engine_kb: engine_pid.and_then(rss_kb),
                    server_anon_kb: server_pid.and_then(rss_anon_kb),
                    engine_anon_kb: engine_pid.and_then(rss_anon_kb),
                    engine_pid,
                });
                tokio::time::sleep(every).await;
            }
            samples
        })
    };
    let mut tasks = Vec::new();
    for client in 0..opts.clients {
        let (outcomes, o) = (outcomes.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            // Spread the first requests over 100 ms so their arrival order is a real order.
            tokio::time::sleep(Duration::from_millis(
                client as u64 * 100 / o.clients as u64,
            ))
            .await;
            let mut seq = 0;
            while t0.elapsed() < o.duration {
                let spec = spec_for(client, seq, o.max_tokens, o.cancel_every);
                let sent = ms(t0);
                let mut out =
                    match tokio::time::timeout(o.request_timeout, run_one(o.addr, &spec, t0)).await
                    {
                        Ok(out) => out,
                        Err(_) => Outcome {
                            api: Some(spec.api),
                            stream: spec.stream,
                            cancel: spec.cancel,
                            sent_ms: sent,
                            end_ms: ms(t0),
                            error: Some(format!("no answer within {:?}", o.request_timeout)),
                            ..Default::default()
                        },
                    };
                out.client = client;
                out.seq = seq;
                outcomes.lock().unwrap_or_else(|p| p.into_inner()).push(out);
                seq += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = t0.elapsed();
    stop_sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.await.unwrap_or_default();
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap_or_else(|p| p.into_inner()));
    report(opts, outcomes, samples, wall)
}

fn order_check(outcomes: &[Outcome], slack: Duration) -> OrderCheck {
    let slack_us = slack.as_micros() as u64;
    let mut q: Vec<(u64, u64, u64, f64)> = outcomes
        .iter()
        .filter_map(|o| o.queue.map(|(id, qu, st)| (id, qu, st, o.sent_ms)))
        .collect();
    q.sort_by_key(|x| x.0);
    let mut c = OrderCheck {
        requests: q.len(),
        slack_ms: slack.as_secs_f64() * 1e3,
        ..Default::default()
    };
    let mut max_queued = 0u64;
    for (i, &(_, queued, started, _)) in q.iter().enumerate() {
        if i > 0 && started < q[i - 1].2 {
            c.start_inversions += 1;
        }
        if max_queued > queued {
            if max_queued > queued + slack_us {
                c.server_inversions += 1;
            } else {
                c.server_inversions_within_slack += 1;
            }
        }
        max_queued = max_queued.max(queued);
    }
    // Client clock: a request sent more than the slack (the server's work before the queue:
    // parsing, templating, tokenizing) after another reached the queue after it, so it must be
    // served after it.
    let slack_ms = c.slack_ms;
    let mut by_sent: Vec<(f64, u64)> = q.iter().map(|x| (x.3, x.0)).collect();
    by_sent.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut k, mut max_id) = (0, 0u64);
    for &(sent, id) in &by_sent {
        while k < by_sent.len() && by_sent[k].0 + slack_ms < sent {
            max_id = max_id.max(by_sent[k].1);
            k += 1;
        }
        if max_id > id {
            c.client_inversions += 1;
        }
    }
    c
}

fn report(
    opts: &LoadOptions,
    outcomes: Vec<Outcome>,
    samples: Vec<RssSample>,
    wall: Duration,
) -> LoadReport {
    let mut r = LoadReport {
        clients: opts.clients,
        duration_s: opts.duration.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        requests: outcomes.len(),
        rss_growth_limit_kb: opts.rss_growth_limit_kb,
        ..Default::default()
    };
    let mut kinds: HashMap<String, usize> = HashMap::new();
    let (mut ttft, mut wait, mut lat, mut tps) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for o in &outcomes {
        let kind = format!(
            "{:?}{}{}",
            o.api.unwrap_or(Api::Chat),
            if o.stream { "+stream" } else { "" },
            if o.cancel { "+cancel" } else { "" }
        )
        .to_lowercase();
        *kinds.entry(kind).or_default() += 1;
        if !o.ok {
            r.failed += 1;
            if r.failures.len() < 20 {
                r.failures.push(format!(
                    "client {} #{} {:?} stream={}: {}",
                    o.client,
                    o.seq,
                    o.api,
                    o.stream,
                    o.error.as_deref().unwrap_or("?")
                ));
            }
            continue;
        }
        if o.cancelled {
            r.cancelled += 1;
        } else {
            r.completed += 1;
            lat.push(o.end_ms - o.sent_ms);
        }
        r.tokens += o.tokens as u64;
        if o.stream
            && let Some(f) = o.first_token_ms
        {
            ttft.push(f - o.sent_ms);
        }
        if let Some((_, q, s)) = o.queue {
            wait.push(s.saturating_sub(q) as f64 / 1e3);
        }
        if let Some(t) = o.decode_tps.filter(|t| *t > 0.0) {
            tps.push(t);
        }
    }
    let mut by_kind: Vec<_> = kinds.into_iter().collect();
    by_kind.sort();
    r.by_kind = by_kind;
    r.ttft = Percentiles::of(ttft);
    r.queue_wait = Percentiles::of(wait);
    r.latency = Percentiles::of(lat);
    let first = outcomes.iter().map(|o| o.sent_ms).fold(f64::MAX, f64::min);
    let last = outcomes.iter().map(|o| o.end_ms).fold(0.0, f64::max);
    if last > first {
        r.tokens_per_s = r.tokens as f64 / ((last - first) / 1e3);
    }
    if !tps.is_empty() {
        r.decode_tps_mean = tps.iter().sum::<f64>() / tps.len() as f64;
    }
    r.order = order_check(&outcomes, opts.order_slack);
    let warm = opts.warmup.as_secs_f64();
    let after: Vec<&RssSample> = samples.iter().filter(|s| s.t_s >= warm).collect();
    let series = |f: &dyn Fn(&RssSample) -> Option<u64>| -> Vec<(f64, u64)> {
        after.iter().filter_map(|s| Some((s.t_s, f(s)?))).collect()
    };
    // The engine's series restarts with a new process; use the last one's samples.
    let last_pid = after.iter().rev().find_map(|s| s.engine_pid);
    r.server_rss = summarize_rss(&series(&|s| s.server_kb));
    r.engine_rss = summarize_rss(&series(&|s| {
        s.engine_kb.filter(|_| s.engine_pid == last_pid)
    }));
    r.server_anon = summarize_rss(&series(&|s| s.server_anon_kb));
    r.engine_anon = summarize_rss(&series(&|s| {
        s.engine_anon_kb.filter(|_| s.engine_pid == last_pid)
    }));
    let mut pids: Vec<u32> = samples.iter().filter_map(|s| s.engine_pid).collect();
    pids.dedup();
    r.engine_pids = pids;
    r.rss = samples;

    let mut verdict = Vec::new();
    if r.failed > 0 {
        verdict.push(format!("{} failed requests", r.failed));
    }
    if r.completed == 0 {
        verdict.push("no request completed".into());
    }
    let o = &r.order;
    if o.server_inversions + o.start_inversions + o.client_inversions > 0 {
        verdict.push(format!(
            "out of arrival order: {} server, {} start, {} client inversions",
            o.server_inversions, o.start_inversions, o.client_inversions
        ));
    }
    if o.requests == 0 {
        verdict.push("no queue headers (x-strata-request-id): cannot check the order".into());
    }
    for (name, s) in [
        ("server RSS", &r.server_rss),
        ("engine RSS", &r.engine_rss),
        ("server RssAnon", &r.server_anon),
        ("engine RssAnon", &r.engine_anon),
    ] {
        if let Some(s) = s
            && s.last_kb > s.first_kb + opts.rss_growth_limit_kb
        {
            verdict.push(format!(
                "{name} grew {} KiB after warm-up (limit {})",
                s.last_kb - s.first_kb,
                opts.rss_growth_limit_kb
            ));
        }
    }
    r.passed = verdict.is_empty();
    r.verdict = verdict;
    r
}

impl LoadReport {
    /// The figures, for a terminal.
    pub fn summary(&self) -> String {
        let mb = |k: u64| k as f64 / 1024.0;
        let rss = |s: &Option<RssSummary>| match s {
            Some(s) => format!(
                "first {:.1} MiB, last {:.1} MiB, peak {:.1} MiB, slope {:+.2} MiB/min ({} samples)",
                mb(s.first_kb),
                mb(s.last_kb),
                mb(s.peak_kb),
                s.slope_kb_per_min / 1024.0,
                s.samples
            ),
            None => "not sampled".into(),
        };
        let p = |p: &Percentiles| {
            format!(
                "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (n={})",
                p.p50_ms, p.p99_ms, p.max_ms, p.n
            )
        };
        let o = &self.order;
        let mut s = format!(
            "clients {} x {:.0} s (wall {:.1} s): {} requests, {} completed, {} cancelled mid-stream, {} failed\n",
            self.clients,
            self.duration_s,
            self.wall_s,
            self.requests,
            self.completed,
            self.cancelled,
            self.failed
        );
        s += &format!(
            "kinds: {}\n",
            self.by_kind
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        s += &format!(
            "time to first token (streaming, queue included): {}\n",
            p(&self.ttft)
        );
        s += &format!("queue wait at the server: {}\n", p(&self.queue_wait));
        s += &format!("latency (completed): {}\n", p(&self.latency));
        s += &format!(
            "tokens: {} at {:.2} tokens/s overall; engine decode {:.2} tokens/s (mean of timings)\n",
            self.tokens, self.tokens_per_s, self.decode_tps_mean
        );
        s += &format!(
            "order: {} requests; inversions: server {} (+{} within {:.0} ms), start {}, client {}\n",
            o.requests,
            o.server_inversions,
            o.server_inversions_within_slack,
            o.slack_ms,
            o.start_inversions,
            o.client_inversions
        );
        s += &format!("server RSS: {}\n", rss(&self.server_rss));
        s += &format!("  of which RssAnon: {}\n", rss(&self.server_anon));
        s += &format!("engine RSS: {}\n", rss(&self.engine_rss));
        s += &format!("  of which RssAnon: {}\n", rss(&self.engine_anon));
        s += &format!("engine pids: {:?}\n", self.engine_pids);
        for f in &self.failures {
            s += &format!("failure: {f}\n");
        }
        s += &if self.passed {
            "PASS".to_string()
        } else {
            format!("FAIL: {}", self.verdict.join("; "))
        };
        s
    }
}

// ---------------------------------------------------------------------------------------------
// `strata server` as a child process

/// A running `strata server` (or `examples/serve`), stopped (SIGINT, then SIGKILL) on drop.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// Everything it wrote to stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Run `exe args...` (which must include `--port 0` or a free port) and wait for its
    /// "listening on http://ADDR" line. Its stderr is drained into [`ServerProcess::log`] (and
    /// echoed when `echo`).
    pub fn spawn(exe: &Path, args: &[String], echo: bool) -> Result<ServerProcess, String> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {}: {e}", exe.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if echo {
                    eprintln!("[server] {line}");
                }
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
                let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut p = ServerProcess {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => {
                p.addr = a
                    .parse()
                    .map_err(|e| format!("bad listening address {a:?}: {e}"))?;
                Ok(p)
            }
            Err(_) => Err(format!(
                "{} did not print its listening line: {}",
                exe.display(),
                p.log_text()
            )),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// SIGINT, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = signal(self.child.id(), "INT");
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Send `SIG<name>` (`KILL`, `STOP`, `INT`, ...) to `pid` with kill(1).
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let st = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid}: {st}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_parser_splits_events_across_pieces() {
        let mut p = SseParser::default();
        assert!(p.push(b"event: a\ndata: {\"x\"").is_empty());
        let ev = p.push(b": 1}\n\n: keep-alive\n\ndata: [DONE]\n\n");
        assert_eq!(
            ev,
            vec![
                (Some("a".to_string()), "{\"x\": 1}".to_string()),
                (None, "[DONE]".to_string())
            ]
        );
    }

    #[test]
    fn percentiles_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50_ms, p.p99_ms, p.max_ms), (50.0, 99.0, 100.0));
    }

    #[test]
    fn order_check_counts_inversions() {
        let o = |id, queued, sent_ms, head_ms| Outcome {
            queue: Some((id, queued, queued + 10)),
            sent_ms,
            head_ms: Some(head_ms),
            ..Default::default()
        };
        // In order.
        let c = order_check(
            &[o(1, 100, 0.0, 10.0), o(2, 200, 1.0, 20.0)],
            Duration::ZERO,
        );
        assert_eq!(
            (c.server_inversions, c.start_inversions, c.client_inversions),
            (0, 0, 0)
        );
        // Id 2 entered the queue 1 s before id 1 but was served after it.
        let c = order_check(
            &[o(1, 1_000_100, 0.0, 10.0), o(2, 100, 1.0, 20.0)],
            Duration::from_millis(5),
        );
        assert_eq!(c.server_inversions, 1);
        // Sent 600 ms after id 2, id 1 was served before it.
        let c = order_check(
            &[o(1, 100, 600.0, 700.0), o(2, 100, 0.0, 50.0)],
            Duration::from_millis(100),
        );
        assert_eq!(c.client_inversions, 1);
        // ... but 50 ms is within the slack.
        let c = order_check(
            &[o(1, 100, 50.0, 700.0), o(2, 100, 0.0, 50.0)],
            Duration::from_millis(100),
        );
        assert_eq!(c.client_inversions, 0);
    }

    #[test]
    fn spec_mix_covers_every_kind() {
        let mut seen = std::collections::HashSet::new();
        for c in 0..8 {
            for s in 0..6 {
                let sp = spec_for(c, s, 16, 4);
                assert!((8..=16).contains(&sp.max_tokens));
                assert!(!sp.cancel || sp.stream);
                seen.insert((sp.api, sp.stream, sp.cancel));
            }
        }
        assert_eq!(seen.len(), 9, "{seen:?}"); // 3 APIs x {json, stream, stream+cancel}
    }
}
