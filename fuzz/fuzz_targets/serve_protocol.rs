//! The `--serve` token protocol, engine side: fuzzed host lines through `parse_host_line` and
//! through the whole `serve_loop` with a mock engine (deterministic tokens, some requests
//! failing). Properties, when the loop ends normally: the first line is the hello; every
//! output line is a valid engine message; every request gets exactly one `done` (a malformed
//! line whose id can be read counts as a request), every unattributable line one `error`;
//! no request gets more tokens than its `max_tokens`.
//!
//! Input: the bytes on the engine's stdin, split into lines as the loop does (bytes, so a
//! line that is not UTF-8, or that holds two requests, is one malformed line: an error for
//! every id it names, else one unattributed error; the loop never ends on bad input).
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use server::protocol::{EngineMessage, HostMessage, parse_host_bytes, parse_host_line};
use server::{FinishReason, GenerateRequest, ModelInfo, TokenEngine};

struct Mock;

impl TokenEngine for Mock {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            name: "mock".into(),
            vocab_size: 512,
            context_length: 64,
            eog_tokens: vec![2],
            parallel: 1,
            engine: None,
        }
    }

    fn generate(&mut self, req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String> {
        let seed = req.tokens.iter().fold(7u32, |a, &t| a.wrapping_mul(31).wrapping_add(t));
        if seed % 5 == 0 {
            return Err(format!("mock failure for seed {seed}"));
        }
        for i in 0..seed % 40 {
            if !emit(seed.wrapping_add(i.wrapping_mul(7)) % 512) {
                return Ok(FinishReason::Stop);
            }
        }
        Ok(FinishReason::Length)
    }
}

/// Threads of this process (`/proc/self/status`).
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok()))
        .unwrap_or(0)
}

/// Waits (up to a second) until the reader thread `serve_loop` spawned has exited. The scope
/// returns as soon as the thread's closure is done, but the thread frees its handle and its
/// TLS-destructor list only while it exits; a leak check in between would report those.
fn settle(before: usize) {
    let t0 = std::time::Instant::now();
    while threads() > before && t0.elapsed() < std::time::Duration::from_secs(1) {
        std::thread::yield_now();
    }
}

fuzz_target!(|data: &[u8]| {
    // What the loop must answer, from the same line splitting it uses.
    let mut want_done: HashMap<u64, u32> = HashMap::new();
    let mut max_tokens: HashMap<u64, u64> = HashMap::new();
    let mut want_errors = 0u32;
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Ok(text) = std::str::from_utf8(line) {
            // A line holding one JSON value parses alike both ways.
            let parsed = parse_host_bytes(line);
            if parsed.len() == 1 && serde_json::from_str::<serde_json::Value>(text).is_ok() {
                assert_eq!(parsed[0], parse_host_line(text), "{text:?}");
            }
        }
        for parsed in parse_host_bytes(line) {
            match parsed {
                Ok(HostMessage::Generate(r)) => {
                    *want_done.entry(r.id).or_default() += 1;
                    *max_tokens.entry(r.id).or_default() += u64::from(r.max_tokens);
                }
                Ok(HostMessage::Cancel { .. }) => {}
                Err((Some(id), e)) => {
                    assert!(e.starts_with("malformed request: "), "{e}");
                    *want_done.entry(id).or_default() += 1;
                }
                Err((None, e)) => {
                    assert!(e.starts_with("malformed request: "), "{e}");
                    want_errors += 1;
                }
            }
        }
    }

    let threads_before = threads();
    let mut out = Vec::new();
    let result = server::serve_loop(&mut Mock, data, &mut out);
    settle(threads_before);
    result.expect("bad input never ends the loop");
    let text = String::from_utf8(out).expect("engine output is UTF-8");
    let mut lines = text.lines();
    let hello: EngineMessage = serde_json::from_str(lines.next().expect("hello line")).expect("hello parses");
    assert!(matches!(hello, EngineMessage::Hello { .. }));
    let mut done: HashMap<u64, u32> = HashMap::new();
    let mut tokens: HashMap<u64, u64> = HashMap::new();
    let mut errors = 0u32;
    for l in lines {
        match serde_json::from_str::<EngineMessage>(l).unwrap_or_else(|e| panic!("bad output line {l:?}: {e}")) {
            EngineMessage::Token { id, token } => {
                assert!(token < 512);
                *tokens.entry(id).or_default() += 1;
            }
            EngineMessage::Done(d) => {
                assert!(d.done);
                assert_eq!(d.error.is_some(), d.reason == FinishReason::Error, "{l}");
                *done.entry(d.id).or_default() += 1;
            }
            EngineMessage::Error { .. } => errors += 1,
            EngineMessage::Hello { .. } => panic!("second hello"),
        }
    }
    assert_eq!(done, want_done, "one done per request");
    assert_eq!(errors, want_errors, "one error per unattributable line");
    for (id, n) in tokens {
        assert!(n <= max_tokens.get(&id).copied().unwrap_or(0), "request {id}: {n} tokens");
    }
});
