//! HTTP request bodies of the server: every input is POSTed, in process (no socket), to the
//! server's own router on all four endpoints (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/messages`, `/v1/messages/count_tokens`), so the real handlers parse it, translate it
//! into a conversation (roles, content parts and blocks, tools, tool calls and results,
//! tool_choice), render it with the default chat model's template (Qwen2.5-Coder when cached,
//! else its stand-in over the tiny vocabulary), tokenize it and validate the sampling
//! parameters. The router is built once; its engine cannot start (no such executable), so a
//! request that passes every check gets 503 instead of a generation. The request's stop
//! strings and message texts also go through the streaming text stages (`StopMatcher`,
//! `Utf8Stream`, `ToolCallParser`).
//!
//! Properties: no panic; every answer is 200 (count_tokens), 400 or 503, with a JSON body in
//! the endpoint's API shape (OpenAI `{"error": {...}}`, Anthropic `{"type": "error", ...}`);
//! the stop matcher emits the text up to the first stop string and nothing of it (all of it
//! when no stop string occurs); the UTF-8 stream gives what a lossy conversion of all bytes
//! gives.
//!
//! Input: a request body.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use server::config::Resolved;
use server::openai::{ChatRequest, CompletionRequest, Prompt, parse_body};
use server::text::{StopMatcher, Utf8Stream};
use server::tools::ToolCallParser;
use tower::ServiceExt;

struct App {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
}

fn app() -> &'static App {
    static A: OnceLock<App> = OnceLock::new();
    A.get_or_init(|| {
        let tokenizer = strata_fuzz::default_model_tokenizer_file();
        let cfg = Resolved {
            executable: PathBuf::from("/nonexistent/strata-fuzz-engine"),
            args: Vec::new(),
            tokenizer,
            model_name: Some("fuzz".into()),
            host: "127.0.0.1".into(),
            port: 0,
            startup_timeout: Duration::from_secs(5),
            engine_timeout: None,
            process: Default::default(),
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        let state = rt.block_on(async { server::http::build_state(&cfg) }).expect("server state");
        // Let the supervisor find out that the engine cannot start.
        rt.block_on(async {
            let _ = state.engine.ready().await;
        });
        App { rt, router: server::http::router(Arc::clone(&state)) }
    })
}

const ENDPOINTS: [&str; 4] = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"];

fn post(a: &App, path: &str, body: &[u8]) -> (StatusCode, serde_json::Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    a.rt.block_on(async {
        let resp = a.router.clone().oneshot(req).await.expect("infallible router");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await.expect("response body");
        let v = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{path}: {status} with a body that is not JSON ({e}): {:?}", String::from_utf8_lossy(&bytes))
        });
        (status, v)
    })
}

/// Feeds `text` in pieces of `step` characters; checks what comes out against `stops`.
fn check_stops(stops: &[String], text: &str, step: usize) {
    let mut m = StopMatcher::new(stops.to_vec());
    let mut emitted = String::new();
    let mut stopped = false;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for piece in chars.chunks(step) {
        let start = piece[0].0;
        let end = piece.last().map_or(start, |&(i, c)| i + c.len_utf8());
        let s = m.push(&text[start..end]);
        emitted += &s.emit;
        if s.stopped {
            stopped = true;
            break;
        }
    }
    if !stopped {
        emitted += &m.finish();
    }
    let live: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
    assert!(text.starts_with(&emitted), "emitted text {emitted:?} is not a prefix of {text:?}");
    assert!(!live.iter().any(|s| emitted.contains(s.as_str())), "a stop string was emitted: {emitted:?}");
    if stopped {
        let rest = &text[emitted.len()..];
        assert!(live.iter().any(|s| rest.starts_with(s.as_str())), "stopped at {rest:?}, no stop string there");
    } else {
        assert_eq!(emitted, text, "text lost without a stop string");
    }
    // The same text as a model's answer, through the tool-call parser.
    let mut p = ToolCallParser::new("", stops.to_vec());
    for piece in chars.chunks(step) {
        let start = piece[0].0;
        let end = piece.last().map_or(start, |&(i, c)| i + c.len_utf8());
        let _ = p.push(&text[start..end]);
    }
    let _ = p.finish();
}

fn check_utf8(bytes: &[u8], step: usize) {
    let mut u = Utf8Stream::default();
    let mut out = String::new();
    for c in bytes.chunks(step) {
        out += &u.push(c);
    }
    out += &u.finish();
    assert_eq!(out, String::from_utf8_lossy(bytes));
}

// The fixtures (server state) load before the first input, so their one-time cost (seconds
// under ASan, more on a busy machine) is not counted against that input's -timeout.
fuzz_target!(init: { app(); }, |data: &[u8]| {
    let a = app();
    for path in ENDPOINTS {
        let (status, body) = post(a, path, data);
        match status.as_u16() {
            200 => assert!(path.ends_with("count_tokens") && body["input_tokens"].is_u64(), "{path}: 200 {body}"),
            400 | 503 => {}
            s => panic!("{path}: status {s} for a request body: {body}"),
        }
        if !status.is_success() {
            if path.starts_with("/v1/messages") {
                assert!(body["type"] == "error" && body["error"]["message"].is_string(), "{path}: {body}");
            } else {
                assert!(body["error"]["message"].is_string() && body["error"]["type"].is_string(), "{path}: {body}");
            }
        }
    }

    let step = data.len() % 7 + 1;
    check_utf8(data, step);
    if let Ok(req) = parse_body::<ChatRequest>(data) {
        let stops = match req.params.stop {
            None => Vec::new(),
            Some(server::openai::Stop::One(s)) => vec![s],
            Some(server::openai::Stop::Many(v)) => v,
        };
        let text: String = req
            .messages
            .into_iter()
            .filter_map(|m| m.content?.into_text().ok())
            .collect();
        check_stops(&stops, &text, step);
    }
    if let Ok(req) = parse_body::<CompletionRequest>(data)
        && let Prompt::Text(p) = req.prompt
    {
        let stops = match req.params.stop {
            None => Vec::new(),
            Some(server::openai::Stop::One(s)) => vec![s],
            Some(server::openai::Stop::Many(v)) => v,
        };
        check_stops(&stops, &p, step);
    }
});
