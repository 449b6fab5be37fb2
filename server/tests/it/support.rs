//! Helpers of the HTTP tests: model and tokenizer, an in-process server on the fake engine, a
//! minimal HTTP/1.1 client, and the expected output of the fake engine.

#![allow(dead_code)]

use serde_json::Value;
use server::config::Resolved;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokenizer::Tokenizer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn model_path() -> PathBuf {
    let dir = std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata/models"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "default model missing: {} (set STRATA_MODEL_DIR)", p.display());
    p
}

pub fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let g = gguf::GgufFile::open(&model_path()).expect("open gguf");
        Tokenizer::from_gguf(&g).expect("tokenizer")
    })
}

/// A bin target of this package, so cargo builds it for every integration test run.
pub fn fake_engine() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fake_engine"))
}

pub fn scratch_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("strata-server-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

pub struct TestServer {
    pub addr: SocketAddr,
}

pub async fn start_server(engine_args: &[&str]) -> TestServer {
    start_server_with(model_path(), engine_args).await
}

pub async fn start_server_with(tokenizer: PathBuf, engine_args: &[&str]) -> TestServer {
    start_server_full(tokenizer, engine_args, None).await
}

pub async fn start_server_full(
    tokenizer: PathBuf,
    engine_args: &[&str],
    engine_timeout: Option<Duration>,
) -> TestServer {
    start_server_opts(tokenizer, engine_args, engine_timeout, None).await
}

/// The server on the fake engine, with `engine_timeout` and `send_timeout` (as `run_server`
/// sets them up: connections through `serve::serve`).
pub async fn start_server_opts(
    tokenizer: PathBuf,
    engine_args: &[&str],
    engine_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
) -> TestServer {
    start_server_keyed(tokenizer, engine_args, engine_timeout, send_timeout, None).await
}

/// [`start_server_opts`] behind an API key (`None`: none), as `run_server` serves it.
pub async fn start_server_keyed(
    tokenizer: PathBuf,
    engine_args: &[&str],
    engine_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
    api_key: Option<server::config::ApiKey>,
) -> TestServer {
    let cfg = Resolved {
        executable: fake_engine(),
        args: engine_args.iter().map(|s| s.to_string()).collect(),
        tokenizer,
        model_name: None,
        host: "127.0.0.1".into(),
        port: 0,
        startup_timeout: Duration::from_secs(20),
        engine_timeout,
        process: Default::default(),
    };
    serve_resolved(&cfg, send_timeout, api_key).await
}

/// Serve a resolved config in-process, as `run_server` does (a free port, whatever
/// `cfg.port` says).
pub async fn serve_resolved(
    cfg: &Resolved,
    send_timeout: Option<Duration>,
    api_key: Option<server::config::ApiKey>,
) -> TestServer {
    let limits = server::serve::ConnLimits { send_timeout, ..Default::default() };
    serve_limited(cfg, limits, api_key).await
}

/// [`serve_resolved`] with these connection limits.
pub async fn serve_limited(
    cfg: &Resolved,
    limits: server::serve::ConnLimits,
    api_key: Option<server::config::ApiKey>,
) -> TestServer {
    let state = server::http::build_state(cfg).expect("server state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let router = server::http::router_with_key(state, api_key);
    tokio::spawn(server::serve::serve(listener, router, limits, std::future::pending()));
    TestServer { addr }
}

/// The resolved config of the fake engine with `engine_args` (as [`start_server`] runs it).
pub fn fake_config(engine_args: &[&str]) -> Resolved {
    Resolved {
        executable: fake_engine(),
        args: engine_args.iter().map(|s| s.to_string()).collect(),
        tokenizer: model_path(),
        model_name: None,
        host: "127.0.0.1".into(),
        port: 0,
        startup_timeout: Duration::from_secs(20),
        engine_timeout: None,
        process: Default::default(),
    }
}

pub struct Resp {
    pub status: u16,
    /// The status line and headers, lower-cased.
    pub head: String,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// Named SSE events (`event:` + `data:` JSON), in order, as Anthropic's stream sends them.
    pub fn events(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        let mut name = None;
        for line in self.body.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                let data = serde_json::from_str(d.trim()).unwrap_or_else(|e| panic!("event data not JSON ({e}): {d}"));
                out.push((name.take().expect("data after an event line"), data));
            }
        }
        out
    }
    /// `data:` payloads of an SSE body, in order.
    pub fn sse(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim_start().to_string()).collect()
    }
}

/// One HTTP/1.1 request with `Connection: close`; the body is de-chunked.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Resp {
    request_with(addr, method, path, body, &[]).await
}

/// [`request`] with extra header lines (`name`, `value`).
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Resp {
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.unwrap_or("");
    let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    // Written while the response is read: a server that refuses a body (413 on its length)
    // answers and closes without reading it, so the rest of the write fails with a reset or
    // a broken pipe while the response is already on its way.
    let (mut rd, mut wr) = s.into_split();
    let req = [head.as_bytes(), body.as_bytes()].concat();
    let writer = tokio::spawn(async move {
        let wrote = wr.write_all(&req).await;
        (wr, wrote)
    });
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut raw)).await.expect("response in time");
    let (_wr, wrote) = writer.await.expect("writer task");
    if let Err(e) = read {
        assert!(!raw.is_empty(), "no response: {e}");
    }
    if let Err(e) = wrote {
        assert!(!raw.is_empty(), "request not sent ({e}) and no response");
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status");
    let mut payload = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        payload = dechunk(&payload);
    }
    Resp { status, head, body: String::from_utf8(payload).expect("UTF-8 body") }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).expect("chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

pub async fn post(srv: &TestServer, path: &str, body: Value) -> Resp {
    request(srv.addr, "POST", path, Some(&body.to_string())).await
}

/// Send a request and hang up after the first `min_bytes` bytes of the response (0 = without
/// reading anything, after `wait`).
pub async fn hang_up(addr: SocketAddr, path: &str, body: Value, min_bytes: usize, wait: Duration) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < min_bytes {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed early");
        got.extend_from_slice(&buf[..n]);
    }
    tokio::time::sleep(wait).await;
    drop(s);
}

/// The default chat model (Qwen2.5-Coder-0.5B-Instruct): its template renders tools.
pub fn qwen_path() -> PathBuf {
    let p = model_path().with_file_name(server::config::DEFAULT_MODEL_FILE);
    assert!(p.exists(), "default model missing: {} (strata fetch)", p.display());
    p
}

pub fn qwen() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let g = gguf::GgufFile::open(&qwen_path()).expect("open gguf");
        Tokenizer::from_gguf(&g).expect("tokenizer")
    })
}

/// The requests a `--log` fake engine received.
pub fn logged_requests(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub async fn wait_healthy(srv: &TestServer) -> Value {
    let t0 = Instant::now();
    loop {
        let r = request(srv.addr, "GET", "/health", None).await;
        if r.status == 200 {
            return r.json();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "server not healthy: {}", r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the server sends to the engine for a text prompt: BOS + tokens, specials parsed.
pub fn prompt_ids(text: &str) -> Vec<u32> {
    let t = tok();
    let mut ids = t.encode(text, false, true);
    if t.add_bos() && ids.first() != t.bos().as_ref() {
        ids.insert(0, t.bos().unwrap());
    }
    ids
}

/// The fake engine's output for a prompt: `prompt[1..]` cyclically, until an EOG token or `max`.
pub fn echo(prompt: &[u32], max: usize) -> (Vec<u32>, bool) {
    let mut out = Vec::new();
    for &t in prompt[1..].iter().cycle().take(max) {
        if tok().is_eog(t) {
            return (out, true);
        }
        out.push(t);
    }
    (out, false)
}

/// Text of generated tokens: raw piece bytes, control tokens left out.
pub fn text_of(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter(|&&t| !tok().is_control(t)).flat_map(|&t| tok().token_to_bytes(t)).collect();
    String::from_utf8(bytes).expect("test prompts decode to valid UTF-8")
}

pub fn chunk_texts(r: &Resp, chat: bool) -> (String, Vec<Value>) {
    let data = r.sse();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "stream ends with [DONE]: {}", r.body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let mut text = String::new();
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            let piece = if chat { &ch["delta"]["content"] } else { &ch["text"] };
            text.push_str(piece.as_str().unwrap_or(""));
        }
    }
    (text, chunks)
}

pub fn finish_reasons(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .filter_map(|ch| ch["finish_reason"].as_str().map(String::from))
        .collect()
}

/// `GET /metrics`, parsed with a Prometheus text parser.
pub async fn scrape(addr: SocketAddr, headers: &[(&str, &str)]) -> prometheus_parse::Scrape {
    let r = request_with(addr, "GET", "/metrics", None, headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let lines = r.body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("Prometheus text")
}

/// The value of a counter or gauge sample `name` whose labels include `labels` (`None`: no
/// such sample).
pub fn sample(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value as V;
    s.samples.iter().find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v))).map(|x| {
        match &x.value {
            V::Counter(v) | V::Gauge(v) | V::Untyped(v) => *v,
            V::Histogram(b) => b.iter().find(|c| c.less_than.is_infinite()).map_or(0.0, |c| c.count),
            V::Summary(_) => panic!("{name} is a summary"),
        }
    })
}
