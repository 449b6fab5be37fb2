//! `/v1/messages` (Anthropic's Messages API) against the fake engine with Gemma 3's tokenizer:
//! the conversation reaches the engine rendered by the chat template, the echoed answer comes
//! back in Anthropic's message and event shapes, and errors in Anthropic's error shape.

use crate::support::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokenizer::ChatMessage;

const SYSTEM: &str = "You are terse.";

fn conversation() -> Value {
    json!([
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
    ])
}

/// What the server must send the engine for [`conversation`] with [`SYSTEM`], and the fake
/// engine's answer: the echo of the first rendered turn.
fn expected() -> (Vec<u32>, String) {
    let msgs = [
        ChatMessage::new("system", SYSTEM),
        ChatMessage::new("user", "Hi!"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "What is 2+2?"),
    ];
    let prompt = prompt_ids(&tok().apply_chat_template(&msgs, true).unwrap());
    let (generated, stopped) = echo(&prompt, 1000);
    assert!(stopped, "the echo reaches <end_of_turn>");
    (prompt, text_of(&generated))
}

fn check_error(r: &Resp, status: u16, kind: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error", "{}", r.body);
    assert_eq!(v["error"]["type"], kind, "{}", r.body);
    assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_and_multi_turn_through_the_template_non_streaming() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    let srv = start_server(&["--name", "fake-gemma", "--log", log.to_str().unwrap()]).await;
    let (prompt, text) = expected();
    let body = json!({"model": "claude-x", "max_tokens": 1000, "system": SYSTEM,
                      "messages": conversation(), "temperature": 0.5, "top_p": 0.9, "top_k": 7});
    let r = post(&srv, "/v1/messages", body.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("msg"), "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "fake-gemma");
    assert_eq!(v["content"], json!([{"type": "text", "text": text}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["input_tokens"], prompt.len());
    assert_eq!(v["usage"]["output_tokens"], echo(&prompt, 1000).0.len());

    // The system prompt as text blocks is the same request.
    let mut blocks = body;
    blocks["system"] = json!([{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]);
    let r = post(&srv, "/v1/messages", blocks).await;
    assert_eq!(r.json()["content"][0]["text"], text, "{}", r.body);

    let logged = logged_requests(&log);
    assert_eq!(logged.len(), 2);
    for l in &logged {
        assert_eq!(l["tokens"], json!(prompt));
        assert_eq!(l["sampling"]["temperature"], 0.5);
        assert_eq!(l["sampling"]["top_k"], 7);
        assert!((l["sampling"]["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
        assert_eq!(l["max_tokens"], 1000);
    }

    let r = post(&srv, "/v1/messages/count_tokens", json!({"system": SYSTEM, "messages": conversation()})).await;
    assert_eq!(r.json(), json!({"input_tokens": prompt.len()}), "{}", r.body);
}

/// The names of the events, and the text of the text deltas.
fn event_names_and_text(events: &[(String, Value)]) -> (Vec<String>, String) {
    let mut names: Vec<String> = Vec::new();
    let mut text = String::new();
    for (name, data) in events {
        assert_eq!(&data["type"], name.as_str(), "event name is the data's type");
        if name == "content_block_delta" {
            assert_eq!(data["delta"]["type"], "text_delta");
            text.push_str(data["delta"]["text"].as_str().unwrap());
        }
        // Runs of deltas count once.
        if names.last() != Some(name) || name != "content_block_delta" {
            names.push(name.clone());
        }
    }
    (names, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_event_sequence() {
    let srv = start_server(&[]).await;
    let (prompt, text) = expected();
    let body = json!({"max_tokens": 1000, "system": SYSTEM, "messages": conversation(), "stream": true});
    let r = post(&srv, "/v1/messages", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    let (names, streamed) = event_names_and_text(&events);
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(streamed, text);
    let start = &events[0].1["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["usage"]["input_tokens"], prompt.len());
    assert_eq!(events[2].1["content_block"], json!({"type": "text", "text": ""}));
    assert!(events.iter().all(|(n, d)| !n.starts_with("content_block") || d["index"] == 0));
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["delta"]["stop_sequence"], Value::Null);
    assert_eq!(delta["usage"]["output_tokens"], echo(&prompt, 1000).0.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_and_max_tokens() {
    let srv = start_server(&[]).await;
    let user = "Hello world, this is a test of the server";
    let prompt = prompt_ids(&tok().apply_chat_template(&[ChatMessage::new("user", user)], true).unwrap());
    let full = text_of(&echo(&prompt, 1000).0);
    let cut = &full[..full.find(" test").unwrap()];
    for stream in [false, true] {
        let body = json!({"max_tokens": 500, "stream": stream, "stop_sequences": ["never", " test"],
                          "messages": [{"role": "user", "content": user}]});
        let r = post(&srv, "/v1/messages", body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let (text, reason, sequence) = if stream {
            let events = r.events();
            let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
            let d = delta.1["delta"].clone();
            (event_names_and_text(&events).1, d["stop_reason"].clone(), d["stop_sequence"].clone())
        } else {
            let v = r.json();
            (
                v["content"][0]["text"].as_str().unwrap().to_string(),
                v["stop_reason"].clone(),
                v["stop_sequence"].clone(),
            )
        };
        assert_eq!(text, cut, "stream={stream}");
        assert_eq!((reason, sequence), (json!("stop_sequence"), json!(" test")));

        let body = json!({"max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": user}]});
        let r = post(&srv, "/v1/messages", body).await;
        let (text, reason, output) = if stream {
            let events = r.events();
            let d = events.iter().find(|(n, _)| n == "message_delta").unwrap().1.clone();
            (event_names_and_text(&events).1, d["delta"]["stop_reason"].clone(), d["usage"]["output_tokens"].clone())
        } else {
            let v = r.json();
            (
                v["content"][0]["text"].as_str().unwrap().to_string(),
                v["stop_reason"].clone(),
                v["usage"]["output_tokens"].clone(),
            )
        };
        assert_eq!(text, text_of(&echo(&prompt, 3).0));
        assert_eq!((reason, output), (json!("max_tokens"), json!(3)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailing_assistant_turn_is_a_prefill() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    let srv = start_server(&["--log", log.to_str().unwrap()]).await;
    let body = json!({"max_tokens": 4, "messages": [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One,"}]});
    let r = post(&srv, "/v1/messages", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let rendered = tok().apply_chat_template(&[ChatMessage::new("user", "Count to three.")], true).unwrap();
    assert_eq!(logged_requests(&log)[0]["tokens"], json!(prompt_ids(&format!("{rendered}One,"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_anthropic_errors() {
    let srv = start_server(&["--context", "64"]).await;
    wait_healthy(&srv).await;
    let user = |content: Value| json!({"max_tokens": 8, "messages": [{"role": "user", "content": content}]});
    let with = |key: &str, value: Value| {
        let mut b = user(json!("x"));
        b[key] = value;
        b.to_string()
    };
    let bad = [
        "{not json".to_string(),
        json!({"messages": [{"role": "user", "content": "x"}]}).to_string(), // no max_tokens
        with("max_tokens", json!(0)),
        with("max_tokens", json!("many")),
        with("messages", json!([])),
        with("messages", json!([{"role": "system", "content": "x"}])),
        with("messages", json!([{"role": "user"}])),
        user(json!(42)).to_string(),
        user(json!([{"type": "image", "source": {"type": "base64", "data": ""}}])).to_string(),
        user(json!([{"type": "text"}])).to_string(),
        user(json!([{"text": "no type"}])).to_string(),
        with("system", json!([{"type": "image"}])),
        with("temperature", json!(1.5)),
        with("top_p", json!(0)),
        with("stop_sequences", json!("not a list")),
        user(json!("word ".repeat(100))).to_string(), // longer than the context
        // Gemma 3's template has no tools.
        with("tools", json!([{"name": "f", "input_schema": {"type": "object"}}])),
        with("tool_choice", json!({"type": "sometimes"})),
    ];
    for body in bad {
        let r = request(srv.addr, "POST", "/v1/messages", Some(&body)).await;
        check_error(&r, 400, "invalid_request_error");
    }
    let huge = format!(
        "{{\"max_tokens\": 1, \"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "a".repeat(3 << 20)
    );
    let r = request(srv.addr, "POST", "/v1/messages", Some(&huge)).await;
    check_error(&r, 413, "request_too_large");
    // Still serving.
    let r = post(&srv, "/v1/messages", user(json!("x y"))).await;
    assert_eq!(r.status, 200, "{}", r.body);

    let down = start_server(&["--fail-on-start"]).await;
    let r = post(&down, "/v1/messages", user(json!("x"))).await;
    check_error(&r, 503, "api_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_crash_mid_stream_is_an_error_event() {
    let dir = scratch_dir();
    let marker = dir.join("crashed");
    let srv = start_server(&["--crash-after", "3", "--crash-marker", marker.to_str().unwrap()]).await;
    let body =
        json!({"max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "Hello there friend"}]});
    let r = post(&srv, "/v1/messages", body.clone()).await;
    assert_eq!(r.status, 200);
    let events = r.events();
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error", "{}", r.body);
    assert_eq!(data["error"]["type"], "api_error", "{}", r.body);
    assert!(!events.iter().any(|(n, _)| n == "message_stop"));
    let r = post(&srv, "/v1/messages", body).await;
    assert_eq!(r.events().last().unwrap().0, "message_stop", "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_at_the_engine() {
    // A scripted answer of 3000 tokens at 20 ms each: one that is not cancelled would block the
    // queue for a minute. (9259 is Gemma's "Hello".)
    let reply = vec!["9259"; 3000].join(",");
    let srv = start_server(&["--delay-ms", "20", "--reply-tokens", &reply]).await;
    wait_healthy(&srv).await;
    for stream in [true, false] {
        let min_bytes = if stream { 300 } else { 0 };
        let body = json!({"max_tokens": 4000, "stream": stream, "messages": [{"role": "user", "content": "Hi"}]});
        hang_up(srv.addr, "/v1/messages", body, min_bytes, Duration::from_millis(300)).await;
        let t0 = Instant::now();
        let r =
            post(&srv, "/v1/messages", json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["content"][0]["text"], "HelloHello");
        assert!(t0.elapsed() < Duration::from_secs(5), "stream={stream}: queued behind an abandoned request");
    }
}
