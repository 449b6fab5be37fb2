//! Fault injection against the fake engine (docs/reliability.md, "Fault injection"): the
//! engine killed with SIGKILL mid-stream under load, an engine that hangs mid-stream
//! (`engine_timeout`), a client that stops reading (`send_timeout`), an engine that cannot
//! start (its stderr in the error). The same faults on the real engine: tests/cli/server_faults.rs.

use crate::support::*;
use serde_json::{Value, json};
use server::load::{self, Api, Outcome, Spec};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PROMPT: &str = "Hello world, this is a test of the server";

fn spec(api: Api, stream: bool, max_tokens: u32) -> Spec {
    Spec { api, stream, cancel: false, max_tokens, prompt: PROMPT.into(), seed: 1 }
}

async fn health(addr: SocketAddr) -> Value {
    load::health(addr).await.expect("health").1
}

/// Wait until the engine runs one request and `waiting` more are queued.
async fn wait_queue(addr: SocketAddr, waiting: u64) -> Value {
    let t0 = Instant::now();
    loop {
        let h = health(addr).await;
        if h["requests_in_flight"] == 1 && h["requests_waiting"].as_u64() >= Some(waiting) {
            return h;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "queue never filled: {h}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Wait for a healthy engine other than `old_pid`; returns how long it took.
async fn wait_new_engine(addr: SocketAddr, old_pid: u64, t0: Instant) -> Duration {
    loop {
        let h = health(addr).await;
        if h["status"] == "ok" && h["engine_pid"].as_u64().is_some_and(|p| p != old_pid) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no new engine: {h}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The in-flight request's error, checked for the shape of its API: OpenAI's
/// `{"error": {"type", "message", "code"}}` (a JSON body or the last SSE data chunk, no
/// `[DONE]`) or Anthropic's `{"type": "error", "error": {"type", "message"}}` (body or `error`
/// event, no `message_stop`).
fn check_api_error(o: &Outcome, status: u16, kind: &str, message: &str) {
    assert!(!o.ok, "the request in flight must fail: {o:?}");
    let body = o.error_body.as_ref().unwrap_or_else(|| panic!("no error body: {o:?}"));
    assert_eq!(o.status, status, "{o:?}");
    match o.api {
        Some(Api::Messages) => {
            assert_eq!(body["type"], "error", "{body}");
            assert_eq!(body["error"]["type"], kind, "{body}");
        }
        _ => {
            assert_eq!(body["error"]["type"], "server_error", "{body}");
            if kind == "timeout_error" {
                assert_eq!(body["error"]["code"], "engine_timeout", "{body}");
            }
        }
    }
    let msg = body["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains(message), "{msg:?} lacks {message:?}");
}

/// SIGKILL to the engine while it streams (or builds a JSON answer) with requests queued
/// behind it, once per API shape: the request in flight gets an error in its API's shape, the
/// queued ones (every API, streaming or not) are answered in full by the restarted engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_engine_under_load_fails_in_flight_in_api_shape_and_serves_queued() {
    let srv = start_server(&["--delay-ms", "25"]).await;
    wait_healthy(&srv).await;
    let addr = srv.addr;
    let t_start = Instant::now();
    let rounds = [
        (Api::Completion, true, 200, "server_error"),
        (Api::Messages, true, 200, "api_error"),
        (Api::Chat, false, 500, "server_error"),
        (Api::Messages, false, 500, "api_error"),
    ];
    let mut restarts = Vec::new();
    for (round, &(api, stream, status, kind)) in rounds.iter().enumerate() {
        let victim = spec(api, stream, 400);
        let t0 = Instant::now();
        let inflight = tokio::spawn(async move { load::run_one(addr, &victim, t0).await });
        wait_queue(addr, 0).await;
        let queued: Vec<_> = [
            spec(Api::Chat, true, 4),
            spec(Api::Completion, false, 4),
            spec(Api::Messages, true, 4),
            spec(Api::Messages, false, 4),
        ]
        .into_iter()
        .map(|s| tokio::spawn(async move { load::run_one(addr, &s, t0).await }))
        .collect();
        let h = wait_queue(addr, queued.len() as u64).await;
        // A few tokens into the answer.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let pid = h["engine_pid"].as_u64().expect("engine_pid in /health");
        let t_kill = Instant::now();
        load::signal(pid as u32, "KILL").unwrap();
        let o = inflight.await.unwrap();
        if stream {
            assert!(o.text_deltas > 0, "killed before the stream started: {o:?}");
        }
        check_api_error(&o, status, kind, "engine");
        let restart = wait_new_engine(addr, pid, t_kill).await;
        restarts.push(restart);
        for q in queued {
            let q = q.await.unwrap();
            assert!(q.ok, "round {round}: a queued request failed: {q:?}");
            assert_eq!(q.tokens, 4, "{q:?}");
        }
    }
    let h = health(addr).await;
    assert_eq!(h["engine_restarts"], rounds.len());
    // Backoff 250 ms, doubling per crash within 30 s of the last start: 0.25 + 0.5 + 1 + 2 s.
    for (i, r) in restarts.iter().enumerate() {
        assert!(*r < Duration::from_secs(5), "restart {i} took {r:?}");
    }
    println!("fake engine restarts after SIGKILL: {restarts:?} (total {:?})", t_start.elapsed());
}

/// An engine that stops mid-stream (alive, silent): after `engine_timeout` it is killed and
/// restarted, the stream ends with a timeout error (OpenAI: `code: "engine_timeout"`; the
/// status was 200 already), a queued request is served by the new engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_engine_mid_stream_times_out_and_is_replaced() {
    let dir = scratch_dir();
    let marker = dir.join("hung");
    let srv = start_server_full(
        model_path(),
        &["--delay-ms", "10", "--hang-after", "5", "--hang-marker", marker.to_str().unwrap()],
        Some(Duration::from_millis(1000)),
    )
    .await;
    wait_healthy(&srv).await;
    let addr = srv.addr;
    let t0 = Instant::now();
    let victim = spec(Api::Chat, true, 100);
    let inflight = tokio::spawn(async move { load::run_one(addr, &victim, t0).await });
    wait_queue(addr, 0).await;
    let queued = tokio::spawn(async move { load::run_one(addr, &spec(Api::Messages, false, 3), t0).await });
    let h = wait_queue(addr, 1).await;
    let old = h["engine_pid"].as_u64().unwrap();
    let o = inflight.await.unwrap();
    assert!(o.text_deltas > 0, "{o:?}");
    check_api_error(&o, 200, "timeout_error", "no output");
    let hung_for = Duration::from_secs_f64((o.end_ms - o.first_token_ms.unwrap()) / 1e3);
    assert!(
        hung_for >= Duration::from_millis(900) && hung_for < Duration::from_secs(4),
        "timed out after {hung_for:?}"
    );
    println!("hung engine: timeout error {hung_for:?} after the last token: {}", o.error.as_deref().unwrap_or(""));
    let q = queued.await.unwrap();
    assert!(q.ok, "{q:?}");
    wait_new_engine(addr, old, Instant::now()).await;
    assert_eq!(health(addr).await["engine_restarts"], 1);

    // The same hang answered to Anthropic's non-streaming client: 504 timeout_error.
    let marker = dir.join("hung2");
    let srv = start_server_full(
        model_path(),
        &["--hang-after", "2", "--hang-marker", marker.to_str().unwrap()],
        Some(Duration::from_millis(700)),
    )
    .await;
    wait_healthy(&srv).await;
    let o = load::run_one(srv.addr, &spec(Api::Messages, false, 20), Instant::now()).await;
    check_api_error(&o, 504, "timeout_error", "engine_timeout");
    let _ = std::fs::remove_dir_all(dir);
}

/// A streaming client that never reads: once the socket has taken nothing for `send_timeout`
/// the server closes the connection and cancels the request, so the queue moves on. Without
/// the bound the engine would generate a million tokens for it first (and the events would
/// pile up in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_is_dropped_after_send_timeout() {
    let srv = start_server_opts(
        model_path(),
        // 1 ms a token: the engine cannot reach the end of the context within the test, so
        // only the send timeout can free the queue.
        &["--context", "1000000", "--delay-ms", "1"],
        None,
        Some(Duration::from_secs(1)),
    )
    .await;
    wait_healthy(&srv).await;
    let addr = srv.addr;
    // A small receive buffer, so the server's send buffer fills quickly.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stalled = sock.connect(addr).await.unwrap();
    let body = json!({"prompt": PROMPT, "stream": true}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    wait_queue(addr, 0).await;
    let t0 = Instant::now();
    // Queued behind the stalled stream.
    let o = load::run_one(addr, &spec(Api::Completion, false, 2), t0).await;
    assert!(o.ok, "{o:?}");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(8), "blocked behind a client that does not read: {waited:?}");
    // The stalled connection was closed by the server: what is in the buffers, then EOF, and
    // the stream never finished.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stalled.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept the stalled connection open");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{}", &text[..text.len().min(200)]);
    assert!(!text.contains("[DONE]"));
    let h = health(addr).await;
    assert_eq!(h["requests_in_flight"], 0, "{h}");
    assert_eq!(h["engine_restarts"], 0, "{h}");
    println!("queued request answered after {waited:?}; the stalled stream had {} bytes", got.len());
}

/// An engine that exits before its hello: the 503 carries its last stderr line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_start_failure_names_the_engine_error() {
    let srv = start_server(&["--fail-on-start"]).await;
    let r = post(&srv, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("failing on start as asked"), "{msg}");
    assert!(msg.contains("exit status: 2"), "{msg}");
}
