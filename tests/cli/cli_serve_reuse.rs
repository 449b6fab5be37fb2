//! Prompt reuse through `strata --serve`: a chat's second turn, sent to the same engine
//! process, computes only its new tokens (the done line's `prompt_cached_tokens`) and streams
//! what a fresh process streams for it. On the Flash-Next fixture (recurrent states: restored
//! from the checkpoint the first turn ended with) and on a KV-only model.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::models::prompt_reuse::{QWEN3MOE, QWEN4EXP, fixture};

struct Serve {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Serve {
    fn start(model: &str) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["--serve", "-t", "2", "--device", "cpu", "-m", model])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting strata --serve");
        let (stdin, stdout) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        Serve { child, stdin, stdout }
    }

    /// One greedy request of `max` tokens: its ids and its done line.
    fn request(&mut self, id: u64, tokens: &[u32], max: usize) -> (Vec<u32>, serde_json::Value) {
        let req = serde_json::json!({"type": "generate", "id": id, "tokens": tokens, "max_tokens": max,
            "sampling": {"temperature": 0.0}, "stop_tokens": []});
        writeln!(self.stdin, "{req}").unwrap();
        let mut ids = Vec::new();
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the engine closed its output");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            match v["type"].as_str() {
                Some("token") if v["id"] == id => ids.push(v["token"].as_u64().unwrap() as u32),
                Some("done") if v["id"] == id => return (ids, v),
                _ => {}
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn check(rel: &str) {
    let model = fixture(rel);
    let model = model.to_str().unwrap();
    let turn1: Vec<u32> = (0..30).map(|i| 7 + (i * 41) % 900).collect();
    let mut engine = Serve::start(model);
    let (answer, done1) = engine.request(1, &turn1, 8);
    assert_eq!(done1["stats"]["prompt_cached_tokens"], 0, "{rel}: {done1}");
    let turn2 = [&turn1[..], &answer, &[12, 34, 56, 78]].concat();
    let (warm, done2) = engine.request(2, &turn2, 8);
    // The session holds turn 1's prompt and its answer but the last token.
    let cached = (turn1.len() + answer.len() - 1) as u64;
    assert_eq!(done2["stats"]["prompt_cached_tokens"], cached, "{rel}: {done2}");
    let (cold, done_cold) = Serve::start(model).request(1, &turn2, 8);
    assert_eq!(done_cold["stats"]["prompt_cached_tokens"], 0);
    assert_eq!(warm, cold, "{rel}: turn 2 served with reuse differs from a fresh engine's");
}

#[test]
fn cli_serve_reuses_the_previous_turn_qwen4exp() {
    check(QWEN4EXP);
}

#[test]
fn cli_serve_reuses_the_previous_turn_qwen3moe() {
    check(QWEN3MOE);
}
