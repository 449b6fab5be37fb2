//! Issue 39 ("Reliability, second round"), the server's items: the queue count when queued
//! clients hang up, slow clients (header and body timeouts, the per-client connection cap),
//! precise errors for requests the server cannot serve, a broken chat template, and an engine
//! that fails the same way at every start.

use crate::support::*;
use serde_json::{Value, json};
use server::serve::ConnLimits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn health(addr: SocketAddr) -> Value {
    request(addr, "GET", "/health", None).await.json()
}

/// Polls `/health` until `ok` holds for it (or panics after `limit`).
async fn health_until(addr: SocketAddr, limit: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let h = health(addr).await;
        if ok(&h) {
            return h;
        }
        assert!(t0.elapsed() < limit, "not reached within {limit:?}: {h}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn completion_request(body: &str) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Item 1: clients that hang up while queued leave `requests_waiting` (it used to keep them
/// for good: 7 → 10 → 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_clients_that_hang_up_leave_the_queue() {
    let srv = start_server(&["--delay-ms", "100"]).await;
    wait_healthy(&srv).await;
    let addr = srv.addr;
    // Holds the engine (one slot) for about 3 s.
    let busy = tokio::spawn(async move {
        let body = json!({"prompt": "one two three", "max_tokens": 30}).to_string();
        request(addr, "POST", "/v1/completions", Some(&body)).await
    });
    health_until(addr, Duration::from_secs(5), |h| h["requests_in_flight"] == 1).await;
    let body = json!({"prompt": "queued", "max_tokens": 5}).to_string();
    let mut queued = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(completion_request(&body).as_bytes()).await.unwrap();
        queued.push(s);
    }
    health_until(addr, Duration::from_secs(5), |h| h["requests_waiting"] == 3).await;
    drop(queued);
    // Long before the busy request ends, and whatever happens after.
    let h = health_until(addr, Duration::from_secs(2), |h| h["requests_waiting"] == 0).await;
    assert_eq!(h["requests_in_flight"], 1, "{h}");
    // The same count in /metrics and /v1/status.
    let m = scrape(addr, &[]).await;
    assert_eq!(sample(&m, "strata_requests_waiting", &[]), Some(0.0));
    let st = request(addr, "GET", "/v1/status", None).await.json();
    assert_eq!(st["live"]["requests_waiting"], 0, "{st}");
    assert_eq!(busy.await.unwrap().status, 200);
    let h = health(addr).await;
    assert_eq!((&h["requests_waiting"], &h["requests_in_flight"]), (&json!(0), &json!(0)), "{h}");
}

fn limits(header: u64, body: u64, cap: usize) -> ConnLimits {
    ConnLimits {
        send_timeout: None,
        header_timeout: Some(Duration::from_secs(header)),
        body_timeout: Some(Duration::from_secs(body)),
        max_connections_per_client: Some(cap),
    }
}

/// Sends `bytes` one at a time, `every` apart, while reading; returns what was read and when
/// the server closed the connection (`None`: still open after `limit`).
async fn trickle(
    addr: SocketAddr,
    head: &[u8],
    bytes: &[u8],
    every: Duration,
    limit: Duration,
) -> (Vec<u8>, Option<Duration>) {
    let t0 = Instant::now();
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(head).await.unwrap();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        for b in bytes {
            tokio::time::sleep(every).await;
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
        }
        // Keep the connection open, silent.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        let left = limit.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, rd.read(&mut buf)).await {
            Err(_) => break None,
            Ok(Ok(0)) | Ok(Err(_)) => break Some(t0.elapsed()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    writer.abort();
    (got, closed)
}

/// Item 3: a client sending its headers a byte every 300 ms is cut off at `header_timeout`,
/// one sending its body so is answered 408 at `body_timeout` and cut off; a well-behaved client
/// is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_bodies_are_cut_off() {
    let srv = serve_limited(&fake_config(&[]), limits(1, 1, 8), None).await;
    wait_healthy(&srv).await;
    let addr = srv.addr;
    let every = Duration::from_millis(300);
    let headers =
        tokio::spawn(trickle(addr, b"POST /v1/completions HTTP/1.1\r\n", &[b'x'; 40], every, Duration::from_secs(6)));
    let body = json!({"prompt": "slow body", "max_tokens": 1}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let bodies =
        tokio::spawn(
            async move { trickle(addr, head.as_bytes(), body.as_bytes(), every, Duration::from_secs(6)).await },
        );
    let r = post(&srv, "/v1/completions", json!({"prompt": "fine", "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    let (got, closed) = headers.await.unwrap();
    let closed = closed.expect("slow headers cut off");
    assert!(closed >= Duration::from_millis(900) && closed < Duration::from_secs(4), "{closed:?}");
    assert!(got.is_empty(), "no answer: {}", String::from_utf8_lossy(&got));

    let (got, closed) = bodies.await.unwrap();
    let closed = closed.expect("slow body cut off");
    assert!(closed < Duration::from_secs(4), "{closed:?}");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    assert!(text.contains("the request body did not arrive within 1 s (body_timeout)"), "{text}");
}

/// Sends `GET /health` on an open keep-alive connection and reads the answer's head.
async fn get_health(s: &mut TcpStream) -> String {
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The body is small JSON: the answer is complete once its closing brace is in.
    while !got.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answer in time").unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Item 3: connections beyond `max_connections_per_client` from one address get a 429 and are
/// closed; the open ones keep being served, and a slot freed is usable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_client_cap_are_refused() {
    let srv = serve_limited(&fake_config(&[]), limits(10, 10, 3), None).await;
    wait_healthy(&srv).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200 "));
        open.push(s);
    }
    let r = request(srv.addr, "GET", "/health", None).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(
        r.json()["error"]["message"],
        "too many connections from 127.0.0.1: at most 3 at once per client address \
         (max_connections_per_client); close some or retry later"
    );
    assert!(get_health(&mut open[0]).await.starts_with("HTTP/1.1 200 "));
    drop(open.pop());
    // The slot is freed once the server sees the close.
    let t0 = Instant::now();
    loop {
        let r = request(srv.addr, "GET", "/health", None).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(t0.elapsed() < Duration::from_secs(5), "slot not freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Item 4: blocks in the wrong turn, and a conversation without a user turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_turn_errors_say_what_is_wrong() {
    let srv = start_server(&[]).await;
    let cases = [
        (
            json!([{"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]),
            "messages[0].content[1]: a tool_use block belongs in an assistant message (it is a \
             call the model made), not in a user message",
        ),
        (
            json!([{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [
                       {"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}]),
            "messages[1].content[0]: a tool_result block belongs in a user message (it answers \
             a call the model made), not in an assistant message",
        ),
        (
            json!([{"role": "assistant", "content": "Hello"}]),
            "messages: the conversation has no user message: it must start with a user turn (a \
             trailing assistant message only prefills the answer to one)",
        ),
        (json!([]), "messages: at least one message is required"),
        (
            json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages[0].content[0]: content block type \"image\" is not supported (user turns: \
             text, tool_result; assistant turns: text, tool_use)",
        ),
    ];
    for (messages, want) in cases {
        for path in ["/v1/messages", "/v1/messages/count_tokens"] {
            let body = json!({"max_tokens": 4, "messages": messages});
            let r = post(&srv, path, body).await;
            assert_eq!(r.status, 400, "{path} {messages}: {}", r.body);
            assert_eq!(r.json()["error"]["message"], want, "{path}");
        }
    }
}

/// Item 5: a token prompt that is not token ids names the element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_prompt_errors_name_the_element() {
    let srv = start_server(&[]).await;
    let cases = [
        (
            json!([1, -5]),
            "prompt[1]: -5 is not a token id (token ids are integers from 0 to the vocabulary \
             size - 1)",
        ),
        (
            json!([[1, 2], [3, 1.5]]),
            "prompt[1][1]: 1.5 is not a token id (token ids are integers from 0 to the \
             vocabulary size - 1)",
        ),
        (json!([1, "a"]), "prompt[1]: expected a token id (an integer), got a string"),
        (json!(["a", 2]), "prompt[1]: expected a string like prompt[0], got a number"),
        (
            json!({"text": "a"}),
            "prompt must be a string, a list of strings, a list of token ids or a list of token \
             id lists, not an object",
        ),
    ];
    for (prompt, want) in cases {
        let r = post(&srv, "/v1/completions", json!({"prompt": prompt})).await;
        assert_eq!(r.status, 400, "{prompt}: {}", r.body);
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.starts_with(&format!("invalid request body: {want} at line 1 column ")), "{prompt}: {msg}");
    }
    let r = post(&srv, "/v1/completions", json!({"prompt": [2, 300000]})).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], "token id 300000 is out of range (vocabulary of 262144)");
}

/// Item 6: a tool choice that forces a call needs tools, in both APIs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_choice_without_tools_is_a_400() {
    let srv = start_server(&[]).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    for (choice, shown) in [
        (json!("required"), "\"required\""),
        (
            json!({"type": "function", "function": {"name": "f"}}),
            "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}",
        ),
    ] {
        let r = post(&srv, "/v1/chat/completions", json!({"messages": user, "tool_choice": choice})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(
            r.json()["error"]["message"],
            format!(
                "tool_choice {shown} requires a tool call, but the request has no `tools`: add \
                 the tools the model may call, or drop tool_choice"
            )
        );
    }
    for (choice, shown) in [
        (json!({"type": "any"}), "{\"type\": \"any\"}"),
        (json!({"type": "tool", "name": "f"}), "{\"type\": \"tool\", \"name\": \"f\"}"),
    ] {
        let body = json!({"max_tokens": 4, "messages": user, "tool_choice": choice});
        let r = post(&srv, "/v1/messages", body).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        assert_eq!(
            r.json()["error"]["message"],
            format!(
                "tool_choice {shown} requires a tool call, but the request has no `tools`: add \
                 the tools the model may call, or drop tool_choice"
            )
        );
    }
    // Not forcing a call without tools stays fine.
    let r = post(&srv, "/v1/chat/completions", json!({"messages": user, "tool_choice": "auto", "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// The default test model's tokenizer with `template` as its chat template.
fn tokenizer_with_template(template: &str) -> PathBuf {
    let g = gguf::GgufFile::open(&model_path()).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    w.add_metadata("tokenizer.chat_template", gguf::Value::Str(template.into()));
    let path = scratch_dir().join("templated.gguf");
    w.write(&path).unwrap();
    path
}

/// Item 7: a template that cannot be rendered is the server's fault (500, the template error
/// named once); one that refuses the conversation (`raise_exception`) the request's (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_chat_template_is_a_server_error() {
    let broken = start_server_with(tokenizer_with_template("{% for m in messages %}{{ m.content }"), &[]).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = post(&broken, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(r.status, 500, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["type"], "server_error");
    let msg = e["message"].as_str().unwrap();
    assert_eq!(
        msg,
        "the model's chat template is broken (a server-side fault, not the request's): syntax \
         error: unexpected `}`, expected end of variable block (in chat:1)"
    );
    assert!(!msg.contains("chat template: chat template"), "{msg}");
    let body = json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&broken, "/v1/messages", body).await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "api_error");

    let strict = start_server_with(
        tokenizer_with_template(
            "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}\
             {{ messages[0].content }}",
        ),
        &[],
    )
    .await;
    let two = json!({"messages": [{"role": "user", "content": "a"},
                                  {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": "c"}]});
    let r = post(&strict, "/v1/chat/completions", two).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], "the model's chat template refuses this conversation: one message only");
}

/// Item 8: `--startup-timeout 0` (flag or file) is refused when the config is resolved.
#[test]
fn startup_timeout_zero_is_refused() {
    let dir = scratch_dir();
    let file = dir.join("s.json");
    std::fs::write(&file, r#"{"startup_timeout": 0, "tokenizer": "t.gguf"}"#).unwrap();
    let flag =
        server::ServerConfig { startup_timeout: Some(0), tokenizer: Some("t.gguf".into()), ..Default::default() };
    let from_file = server::ServerConfig { config: Some(file), ..Default::default() };
    for cfg in [flag, from_file] {
        let e = format!("{:#}", cfg.resolve().unwrap_err());
        assert_eq!(
            e,
            "startup_timeout (--startup-timeout) must be at least 1 second: it is how long an \
             engine may take to load its model, and with 0 no start could succeed"
        );
    }
    let too_long = server::ServerConfig {
        startup_timeout: Some(u64::MAX),
        tokenizer: Some("t.gguf".into()),
        ..Default::default()
    };
    assert!(
        format!("{:#}", too_long.resolve().unwrap_err()).contains("is too long"),
        "a value the clock cannot add is refused too"
    );
    let one = server::ServerConfig { startup_timeout: Some(1), tokenizer: Some("t.gguf".into()), ..Default::default() };
    assert_eq!(one.resolve().unwrap().startup_timeout, Duration::from_secs(1));
}

/// Item 9: an engine that exits at once with an error: the 503 carries its `error:` line
/// without the backtrace after it, and after a few identical failures it is not started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_failing_at_start_reports_its_error_and_is_given_up() {
    let why = "--max-context 999999 exceeds the model's context of 4096";
    let srv = start_server(&["--fail-with", why]).await;
    let r = post(&srv, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(&format!("; engine stderr: error: {why}")), "{msg}");
    for noise in ["backtrace", "strata::main", "src/main.rs", "fake_engine: loading"] {
        assert!(!msg.contains(noise), "{noise} in {msg}");
    }
    let h = health_until(srv.addr, Duration::from_secs(30), |h| h["status"] == "failed").await;
    let failures = h["engine_start_failures"].clone();
    assert_eq!(failures, server::engine_process::GIVE_UP_AFTER, "{h}");
    assert!(
        h["error"]
            .as_str()
            .unwrap()
            .ends_with("(the engine failed to start 5 times in a row this way; the server does not start it again)"),
        "{h}"
    );
    let st = request(srv.addr, "GET", "/v1/status", None).await.json();
    assert_eq!(st["engine"]["status"], "failed", "{st}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let h = health(srv.addr).await;
    assert_eq!(h["engine_start_failures"], failures, "no start after giving up");
    let t0 = Instant::now();
    let r = post(&srv, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(t0.elapsed() < Duration::from_secs(2), "answered at once");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(why) && msg.contains("does not start it again"), "{msg}");
}
