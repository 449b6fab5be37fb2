//! The HTTP server against the fake engine (`src/bin/fake_engine.rs`), with Gemma 3's real
//! tokenizer. The fake engine echoes `prompt[1..]`, so the expected text of every answer is
//! computed here from the tokenizer alone (an independent path: token bytes concatenated and cut
//! by hand), not by the server's detokenizer.
//!
//! Requests go over a real TCP socket with a minimal HTTP/1.1 client (`support.rs`), so the wire format
//! (status, chunked encoding, SSE framing) is what is tested.

use crate::support::*;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokenizer::Tokenizer;

const PROMPT: &str = "Hello world, this is a test of the server";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_and_completion_length() {
    let srv = start_server(&["--name", "fake-gemma"]).await;
    let h = wait_healthy(&srv).await;
    assert_eq!(h["status"], "ok");
    let m = request(srv.addr, "GET", "/v1/models", None).await.json();
    assert_eq!(m["data"][0]["id"], "fake-gemma");
    assert_eq!(m["data"][0]["meta"]["vocab_size"], 262144);

    let r = post(&srv, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 4})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let prompt = prompt_ids(PROMPT);
    let (generated, _) = echo(&prompt, 4);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "fake-gemma");
    assert_eq!(v["choices"][0]["text"], text_of(&generated));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + 4);
    assert_eq!(
        (v["timings"]["prompt_n"].as_u64(), v["timings"]["predicted_n"].as_u64()),
        (Some(prompt.len() as u64), Some(4))
    );
    assert!(v["timings"]["predicted_ms"].as_f64().unwrap() >= 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_text_streaming_and_not() {
    let srv = start_server(&[]).await;
    let prompt = prompt_ids(PROMPT);
    let (generated, _) = echo(&prompt, 200);
    let full = text_of(&generated);
    let stop = " test";
    let expected = &full[..full.find(stop).expect("stop string occurs")];

    let body = json!({"prompt": PROMPT, "max_tokens": 200, "stop": [stop, "never-there"]});
    let r = post(&srv, "/v1/completions", body.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], expected);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");

    let mut body = body;
    body["stream"] = json!(true);
    body["stop"] = json!(stop);
    let r = post(&srv, "/v1/completions", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (text, chunks) = chunk_texts(&r, false);
    assert_eq!(text, expected);
    assert_eq!(finish_reasons(&chunks), vec!["stop"]);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

fn chat_expectation(user: &str) -> (Vec<u32>, String) {
    let msgs = [tokenizer::ChatMessage { role: "user".into(), content: user.into() }];
    let prompt = prompt_ids(&tok().apply_chat_template(&msgs, true).unwrap());
    let (generated, stopped) = echo(&prompt, 1000);
    assert!(stopped, "the echoed chat prompt contains an end-of-turn token");
    (prompt, text_of(&generated))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_non_streaming_passes_sampling_params() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    let srv = start_server(&["--log", log.to_str().unwrap()]).await;
    let (prompt, expected) = chat_expectation("Hi there, how are you?");
    assert!(expected.contains("Hi there, how are you?"));
    let body = json!({"model": "x", "messages": [{"role": "user", "content": "Hi there, how are you?"}],
                      "temperature": 0.5, "top_p": 0.9, "seed": 42, "max_tokens": 1000});
    let r = post(&srv, "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], expected);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());

    let logged: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(logged["tokens"], json!(prompt));
    assert_eq!(logged["sampling"]["temperature"], 0.5);
    assert!((logged["sampling"]["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    assert_eq!(logged["sampling"]["seed"], 42);
    // Gemma 3's end-of-generation set per llama.cpp (testdata/reference/README.md).
    assert_eq!(logged["stop_tokens"], json!([1, 106, 212]));
    assert_eq!(logged["max_tokens"], 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_with_usage() {
    let srv = start_server(&[]).await;
    let (prompt, expected) = chat_expectation("Tell me a story");
    let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me a story"}]}],
                      "stream": true, "stream_options": {"include_usage": true}});
    let r = post(&srv, "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (text, chunks) = chunk_texts(&r, true);
    assert_eq!(text, expected);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(finish_reasons(&chunks), vec!["stop"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], prompt.len());
    assert_eq!(usage["completion_tokens"].as_u64().unwrap() as usize, echo(&prompt, 1000).0.len());
}

/// Byte-fallback token whose piece is exactly `b`.
fn byte_token(b: u8) -> u32 {
    (0..tok().vocab_size() as u32)
        .find(|&t| !tok().is_control(t) && tok().token_to_bytes(t) == [b])
        .unwrap_or_else(|| panic!("no byte token for {b:#x}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multibyte_character_split_over_byte_tokens() {
    let srv = start_server(&[]).await;
    let mut prompt = vec![tok().bos().unwrap()];
    prompt.extend("é😀".bytes().map(byte_token));
    let n = prompt.len() - 1;
    let r = post(&srv, "/v1/completions", json!({"prompt": prompt, "max_tokens": n, "stream": true})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (text, chunks) = chunk_texts(&r, false);
    assert_eq!(text, "é😀");
    assert!(!r.body.contains('\u{fffd}') && !r.body.contains("\\ufffd"), "no replacement characters: {}", r.body);
    // One text chunk per completed character, then the finish chunk.
    let texts: Vec<&str> =
        chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).filter(|t| !t.is_empty()).collect();
    assert_eq!(texts, vec!["é", "😀"]);
    assert_eq!(finish_reasons(&chunks), vec!["length"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_style_400() {
    let srv = start_server(&["--context", "32"]).await;
    wait_healthy(&srv).await;
    let bad = [
        ("/v1/chat/completions", "{not json".to_string()),
        ("/v1/chat/completions", json!({"messages": []}).to_string()),
        ("/v1/chat/completions", json!({"prompt": "no messages"}).to_string()),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}).to_string()),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "n": 2}).to_string()),
        ("/v1/completions", json!({"prompt": "x", "top_p": 0}).to_string()),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": -5}).to_string()),
        ("/v1/completions", json!({"prompt": [2, 999999]}).to_string()),
        ("/v1/completions", json!({"prompt": ["a", "b"]}).to_string()),
        ("/v1/completions", json!({"prompt": "word ".repeat(40)}).to_string()),
    ];
    for (path, body) in bad {
        let r = request(srv.addr, "POST", path, Some(&body)).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    let r = post(&srv, "/v1/completions", json!({"prompt": "word ".repeat(40)})).await;
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // Over the body limit: 413, still in OpenAI's shape.
    let huge = json!({"prompt": "a".repeat(3 << 20)}).to_string();
    let r = request(srv.addr, "POST", "/v1/completions", Some(&huge)).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "x"}]})).await;
    assert_eq!(r.status, 400, "unknown role: {}", r.body);
    // Still serving.
    let r = post(&srv, "/v1/completions", json!({"prompt": "x y", "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_all_complete_correctly() {
    let srv = start_server(&["--delay-ms", "5"]).await;
    wait_healthy(&srv).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let addr = srv.addr;
        tasks.push(tokio::spawn(async move {
            let prompt = format!("Request number {i} says hello to everyone here");
            let stream = i % 2 == 0;
            let body = json!({"prompt": prompt, "max_tokens": 6, "stream": stream});
            let r = request(addr, "POST", "/v1/completions", Some(&body.to_string())).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let text = if stream {
                chunk_texts(&r, false).0
            } else {
                r.json()["choices"][0]["text"].as_str().unwrap().to_string()
            };
            (prompt, text)
        }));
    }
    for t in tasks {
        let (prompt, text) = t.await.unwrap();
        assert_eq!(text, text_of(&echo(&prompt_ids(&prompt), 6).0), "{prompt}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_crash_fails_in_flight_request_then_restarts() {
    let dir = scratch_dir();
    let marker = dir.join("crashed");
    let srv =
        start_server(&["--crash-after", "3", "--crash-marker", marker.to_str().unwrap(), "--delay-ms", "10"]).await;
    wait_healthy(&srv).await;
    // Two concurrent requests: the one at the engine fails when it crashes at its 3rd token; the
    // one waiting in the server's queue runs on the restarted engine.
    let body = json!({"prompt": PROMPT, "max_tokens": 6}).to_string();
    let (a, b) = tokio::join!(
        request(srv.addr, "POST", "/v1/completions", Some(&body)),
        request(srv.addr, "POST", "/v1/completions", Some(&body))
    );
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [200, 500], "a: {} b: {}", a.body, b.body);
    let failed = if a.status == 500 { &a } else { &b };
    assert_eq!(failed.json()["error"]["type"], "server_error");
    assert!(failed.json()["error"]["message"].as_str().unwrap().contains("engine"), "{}", failed.body);
    let ok = if a.status == 200 { &a } else { &b };
    assert_eq!(ok.json()["choices"][0]["text"], text_of(&echo(&prompt_ids(PROMPT), 6).0));
    let h = wait_healthy(&srv).await;
    assert_eq!(h["engine_restarts"], 1);
    let r = post(&srv, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_crash_during_stream_sends_error_event() {
    let dir = scratch_dir();
    let marker = dir.join("crashed");
    let srv = start_server(&["--crash-after", "3", "--crash-marker", marker.to_str().unwrap()]).await;
    let body =
        json!({"messages": [{"role": "user", "content": "Hello there friend"}], "stream": true, "max_tokens": 50});
    let r = post(&srv, "/v1/chat/completions", body.clone()).await;
    assert_eq!(r.status, 200);
    let data = r.sse();
    assert!(!data.contains(&"[DONE]".to_string()), "{}", r.body);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error", "{}", r.body);
    let r = post(&srv, "/v1/chat/completions", body).await;
    assert_eq!(r.status, 200);
    let (text, _) = chunk_texts(&r, true);
    assert_eq!(text, chat_expectation("Hello there friend").1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_that_cannot_start_gives_503() {
    let srv = start_server(&["--fail-on-start"]).await;
    let t0 = Instant::now();
    let r = post(&srv, "/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("engine"));
    assert!(t0.elapsed() < Duration::from_secs(5), "fails fast, does not wait for the startup timeout");
    let h = request(srv.addr, "GET", "/health", None).await;
    assert_eq!(h.status, 503);
}

#[test]
fn config_file_and_flags_merge() {
    let dir = scratch_dir();
    let file = dir.join("strata.json");
    std::fs::write(
        &file,
        r#"{"engine": {"executable": "bin/strata", "args": ["-m", "m.gguf"]}, "tokenizer": "m.gguf",
            "model_name": "gemma", "host": "0.0.0.0", "port": 9000}"#,
    )
    .unwrap();
    let cfg = server::ServerConfig { config: Some(file.clone()), port: Some(8081), ..Default::default() };
    let r = cfg.resolve().unwrap();
    assert_eq!(r.executable, dir.join("bin/strata"));
    assert_eq!(r.args, vec!["-m", "m.gguf"]);
    assert_eq!(r.tokenizer, dir.join("m.gguf"));
    assert_eq!((r.host.as_str(), r.port, r.model_name.as_deref()), ("0.0.0.0", 8081, Some("gemma")));
    std::fs::write(&file, r#"{"engine": {"executable": "x"}, "tokenizr": "typo.gguf"}"#).unwrap();
    let err = format!("{:#}", cfg.resolve().unwrap_err());
    assert!(err.contains("tokenizr"), "unknown keys are rejected by name: {err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_at_the_engine() {
    // ~4000 tokens at 20 ms each: a request that is not cancelled would block the queue ~80 s.
    let srv = start_server(&["--delay-ms", "20"]).await;
    wait_healthy(&srv).await;
    for stream in [true, false] {
        let min_bytes = if stream { 200 } else { 0 };
        hang_up(
            srv.addr,
            "/v1/completions",
            json!({"prompt": PROMPT, "stream": stream}),
            min_bytes,
            Duration::from_millis(300),
        )
        .await;
        let t0 = Instant::now();
        let r = post(&srv, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(t0.elapsed() < Duration::from_secs(5), "stream={stream}: queued behind an abandoned request");
    }
}

/// A byte-level BPE vocabulary (SmolLM2's, cut to 1,024 tokens) instead of Gemma's SentencePiece.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bpe_tokenizer_completion_and_chat() {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-f32.gguf"
    ));
    assert!(path.exists(), "missing {}", path.display());
    let t = Tokenizer::from_gguf(&gguf::GgufFile::open(&path).unwrap()).unwrap();
    let eog = t.eog_ids().iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let srv = start_server_with(path.clone(), &["--vocab", "1024", "--eog", &eog]).await;
    let ids = |text: &str| {
        let mut ids = t.encode(text, false, true);
        if let Some(b) = t.bos().filter(|_| t.add_bos())
            && ids.first() != Some(&b)
        {
            ids.insert(0, b);
        }
        ids
    };
    let text = |ids: &[u32]| {
        String::from_utf8(ids.iter().filter(|&&i| !t.is_control(i)).flat_map(|&i| t.token_to_bytes(i)).collect())
            .unwrap()
    };
    let prompt = "The quick brown fox jumps over the lazy dog";
    let p = ids(prompt);
    let n = p.len() - 1;
    let r = post(&srv, "/v1/completions", json!({"prompt": prompt, "max_tokens": n})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], text(&p[1..]));

    let msgs = [tokenizer::ChatMessage { role: "user".into(), content: "hello there".into() }];
    let p = ids(&t.apply_chat_template(&msgs, true).unwrap());
    let end = p[1..].iter().position(|&i| t.is_eog(i)).map_or(p.len(), |k| k + 1);
    let r = post(
        &srv,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 200}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], text(&p[1..end]));
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("hello there"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_a_loading_engine() {
    let srv = start_server(&["--hello-delay-ms", "1500"]).await;
    let h = request(srv.addr, "GET", "/health", None).await;
    assert_eq!(h.status, 503, "{}", h.body);
    assert_eq!(h.json()["status"], "loading");
    let r = post(&srv, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 3})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], text_of(&echo(&prompt_ids(PROMPT), 3).0));
    assert_eq!(request(srv.addr, "GET", "/health", None).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_engine_is_killed_after_engine_timeout() {
    let srv = start_server_full(model_path(), &["--delay-ms", "3000"], Some(Duration::from_millis(700))).await;
    wait_healthy(&srv).await;
    // Idle time does not count: only silence while a request is in flight.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let t0 = Instant::now();
    let r = post(&srv, "/v1/completions", json!({"prompt": PROMPT, "max_tokens": 2})).await;
    assert_eq!(r.status, 504, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "engine_timeout", "{}", r.body);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("no output"), "{}", r.body);
    assert!(t0.elapsed() < Duration::from_millis(2900), "killed before its first token: {:?}", t0.elapsed());
    assert_eq!(wait_healthy(&srv).await["engine_restarts"], 1);
}
