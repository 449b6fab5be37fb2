//! `serve_loop` and the protocol types, driven through in-memory pipes with a scripted engine.

use server::protocol::*;
use std::io::{BufRead, BufReader, Cursor, Write};
use std::time::Duration;

/// Emits 100, 101, 102, ... (optionally slowly); fails when the prompt starts with 13;
/// stops by itself (context full) after `limit` tokens.
struct Counting {
    delay: Duration,
    limit: u32,
}

impl TokenEngine for Counting {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            name: "counting".into(),
            vocab_size: 1000,
            context_length: 64,
            eog_tokens: vec![103],
            parallel: 1,
            engine: None,
        }
    }
    fn generate(&mut self, req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String> {
        if req.tokens[0] == 13 {
            return Err("unlucky prompt".into());
        }
        for i in 0..self.limit {
            std::thread::sleep(self.delay);
            if !emit(100 + i) {
                return Ok(FinishReason::Stop);
            }
        }
        Ok(FinishReason::Length)
    }
}

fn run(engine: &mut Counting, input: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    serve_loop(engine, Cursor::new(input.as_bytes().to_vec()), &mut out).expect("serve_loop");
    out.lines().map(|l| serde_json::from_str(&l.unwrap()).expect("every output line is JSON")).collect()
}

fn counting() -> Counting {
    Counting { delay: Duration::ZERO, limit: 1000 }
}

fn tokens_of(lines: &[serde_json::Value], id: u64) -> Vec<u64> {
    lines.iter().filter(|l| l["type"] == "token" && l["id"] == id).map(|l| l["token"].as_u64().unwrap()).collect()
}

fn done_of(lines: &[serde_json::Value], id: u64) -> &serde_json::Value {
    lines.iter().find(|l| l["type"] == "done" && l["id"] == id).unwrap_or_else(|| panic!("no done for {id}: {lines:?}"))
}

#[test]
fn hello_first_then_tokens_and_length() {
    let lines = run(&mut counting(), "{\"type\":\"generate\",\"id\":5,\"tokens\":[1,2],\"max_tokens\":3}\n");
    assert_eq!(lines[0]["type"], "hello");
    assert_eq!(lines[0]["protocol"], 1);
    assert_eq!(lines[0]["model"]["vocab_size"], 1000);
    assert_eq!(lines[0]["model"]["context_length"], 64);
    assert_eq!(tokens_of(&lines, 5), vec![100, 101, 102]);
    let d = done_of(&lines, 5);
    assert_eq!((d["done"].as_bool(), d["reason"].as_str()), (Some(true), Some("length")));
    assert_eq!((d["prompt_tokens"].as_u64(), d["generated_tokens"].as_u64()), (Some(2), Some(3)));
    assert_eq!(lines.len(), 5);
}

#[test]
fn stop_token_ends_and_is_not_emitted() {
    // Default stop tokens = eog_tokens [103]; explicit list overrides; [] disables.
    let input = concat!(
        "{\"type\":\"generate\",\"id\":1,\"tokens\":[1],\"max_tokens\":10}\n",
        "{\"type\":\"generate\",\"id\":2,\"tokens\":[1],\"max_tokens\":10,\"stop_tokens\":[101]}\n",
        "{\"type\":\"generate\",\"id\":3,\"tokens\":[1],\"max_tokens\":5,\"stop_tokens\":[]}\n",
    );
    let lines = run(&mut counting(), input);
    assert_eq!(tokens_of(&lines, 1), vec![100, 101, 102]);
    assert_eq!(done_of(&lines, 1)["reason"], "stop");
    assert_eq!(done_of(&lines, 1)["generated_tokens"], 3);
    assert_eq!(tokens_of(&lines, 2), vec![100]);
    assert_eq!(done_of(&lines, 2)["reason"], "stop");
    assert_eq!(tokens_of(&lines, 3), vec![100, 101, 102, 103, 104]);
    assert_eq!(done_of(&lines, 3)["reason"], "length");
}

#[test]
fn requests_are_served_in_order_one_at_a_time() {
    let input: String = (1..=4)
        .map(|i| format!("{{\"type\":\"generate\",\"id\":{i},\"tokens\":[1],\"max_tokens\":2,\"stop_tokens\":[]}}\n"))
        .collect();
    let lines = run(&mut counting(), &input);
    let ids: Vec<u64> = lines[1..].iter().map(|l| l["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4], "no interleaving: {lines:?}");
}

#[test]
fn engine_stops_on_its_own_and_engine_errors() {
    let mut e = Counting { delay: Duration::ZERO, limit: 2 };
    let input = concat!(
        "{\"type\":\"generate\",\"id\":1,\"tokens\":[1],\"max_tokens\":10,\"stop_tokens\":[]}\n",
        "{\"type\":\"generate\",\"id\":2,\"tokens\":[13],\"max_tokens\":10}\n",
        "{\"type\":\"generate\",\"id\":3,\"tokens\":[1],\"max_tokens\":1}\n",
    );
    let lines = run(&mut e, input);
    assert_eq!(done_of(&lines, 1)["reason"], "length");
    assert_eq!(done_of(&lines, 1)["generated_tokens"], 2);
    let d = done_of(&lines, 2);
    assert_eq!((d["reason"].as_str(), d["error"].as_str()), (Some("error"), Some("unlucky prompt")));
    assert_eq!(tokens_of(&lines, 3), vec![100], "engine still usable after an error");
}

#[test]
fn malformed_lines_get_errors_and_the_loop_goes_on() {
    let input = concat!(
        "this is not json\n",
        "\n",
        "{\"type\":\"generate\",\"id\":7}\n",           // no tokens
        "{\"type\":\"fly\",\"id\":8}\n",                // unknown type
        "{\"id\":9,\"tokens\":[1],\"max_tokens\":1}\n", // no type
        "[1,2,3]\n",
        "{\"type\":\"generate\",\"id\":10,\"tokens\":[],\"max_tokens\":1}\n", // empty prompt
        "{\"type\":\"generate\",\"id\":11,\"tokens\":[5000],\"max_tokens\":1}\n", // >= vocab_size
        "{\"type\":\"generate\",\"id\":12,\"tokens\":[1],\"max_tokens\":1,\"sampling\":{\"top_p\":0}}\n",
        "{\"type\":\"generate\",\"id\":14,\"tokens\":[1],\"max_tokens\":-1}\n",
        "{\"type\":\"cancel\",\"id\":999}\n", // unknown id: ignored
        "{\"type\":\"generate\",\"id\":15,\"tokens\":[1],\"max_tokens\":2}\n",
    );
    let lines = run(&mut counting(), input);
    let anonymous: Vec<_> = lines.iter().filter(|l| l["type"] == "error").collect();
    assert_eq!(anonymous.len(), 2, "{lines:?}"); // "this is not json", "[1,2,3]"
    assert!(anonymous.iter().all(|l| { l["error"].as_str().unwrap().starts_with("malformed request") }));
    for id in [7, 8, 9, 10, 11, 12, 14] {
        let d = done_of(&lines, id);
        assert_eq!(d["reason"], "error", "id {id}: {d}");
        assert!(!d["error"].as_str().unwrap().is_empty());
        assert!(tokens_of(&lines, id).is_empty());
    }
    assert!(done_of(&lines, 11)["error"].as_str().unwrap().contains("5000"));
    assert_eq!(tokens_of(&lines, 15), vec![100, 101]);
    assert!(!lines.iter().any(|l| l["id"] == 999));
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let toks: Vec<String> = (0..64).map(|_| "1".to_string()).collect();
    let input = format!("{{\"type\":\"generate\",\"id\":1,\"tokens\":[{}],\"max_tokens\":1}}\n", toks.join(","));
    let lines = run(&mut counting(), &input);
    assert!(done_of(&lines, 1)["error"].as_str().unwrap().contains("context"));
}

fn send(w: &mut impl Write, line: &str) {
    w.write_all(line.as_bytes()).unwrap();
    w.write_all(b"\n").unwrap();
}

/// A pipe whose reading end yields lines as a test thread writes them.
fn pipe() -> (std::io::PipeWriter, BufReader<std::io::PipeReader>) {
    let (r, w) = std::io::pipe().expect("pipe");
    (w, BufReader::new(r))
}

#[test]
fn cancel_stops_the_running_request_and_a_queued_one() {
    let (mut to_engine, engine_in) = pipe();
    let (from_engine_w, mut from_engine) = pipe();
    let t = std::thread::spawn(move || {
        let mut e = Counting { delay: Duration::from_millis(2), limit: 100_000 };
        serve_loop(&mut e, engine_in, from_engine_w).unwrap();
    });
    let mut line = String::new();
    from_engine.read_line(&mut line).unwrap();
    assert!(line.contains("\"hello\""));
    send(&mut to_engine, r#"{"type":"generate","id":1,"tokens":[1],"max_tokens":100000,"stop_tokens":[]}"#);
    send(&mut to_engine, r#"{"type":"generate","id":2,"tokens":[1],"max_tokens":100000,"stop_tokens":[]}"#);
    // Wait for request 1 to be running, then cancel the queued one first, then the running one.
    line.clear();
    from_engine.read_line(&mut line).unwrap();
    assert!(line.contains("\"token\""), "{line}");
    send(&mut to_engine, r#"{"type":"cancel","id":2}"#);
    send(&mut to_engine, r#"{"type":"cancel","id":1}"#);
    drop(to_engine);
    let rest: Vec<serde_json::Value> =
        from_engine.lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    t.join().unwrap();
    let d1 = done_of(&rest, 1);
    assert_eq!(d1["reason"], "cancelled");
    assert!(d1["generated_tokens"].as_u64().unwrap() < 1000, "cancel took effect promptly: {d1}");
    let d2 = done_of(&rest, 2);
    assert_eq!((d2["reason"].as_str(), d2["generated_tokens"].as_u64()), (Some("cancelled"), Some(0)));
    assert!(tokens_of(&rest, 2).is_empty());
}

#[test]
fn types_round_trip_and_match_the_documented_lines() {
    // These strings are the examples of docs/serve-protocol.md.
    let host = [
        r#"{"type":"generate","id":1,"tokens":[2,9259,1902],"max_tokens":64,"sampling":{"temperature":0.7,"top_k":40,"top_p":0.95,"min_p":0.05,"repeat_penalty":1.0,"repeat_last_n":64,"seed":42},"stop_tokens":[1,106]}"#,
        r#"{"type":"generate","id":2,"tokens":[2,9259],"max_tokens":16}"#,
        r#"{"type":"cancel","id":1}"#,
    ];
    for l in host {
        let m = parse_host_line(l).unwrap_or_else(|e| panic!("{l}: {e:?}"));
        let back = parse_host_line(&to_line(&m)).unwrap();
        assert_eq!(m, back);
    }
    match parse_host_line(host[1]).unwrap() {
        HostMessage::Generate(g) => {
            assert_eq!(g.sampling, SamplingParams::default());
            assert_eq!(g.stop_tokens, None);
        }
        other => panic!("{other:?}"),
    }
    let engine = [
        r#"{"type":"hello","protocol":1,"model":{"name":"gemma-3-270m","vocab_size":262144,"context_length":32768,"eog_tokens":[1,106,212],"parallel":1}}"#,
        r#"{"type":"token","id":1,"token":236772}"#,
        r#"{"type":"done","id":1,"done":true,"reason":"stop","prompt_tokens":3,"generated_tokens":12,"prompt_ms":41.5,"total_ms":230.2}"#,
        r#"{"type":"done","id":3,"done":true,"reason":"error","error":"token 300000 at position 1 is out of range (vocab_size 262144)","prompt_tokens":2,"generated_tokens":0}"#,
        r#"{"type":"error","error":"malformed request: expected value at line 1 column 1"}"#,
    ];
    for l in engine {
        let m: EngineMessage = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        let back: serde_json::Value = serde_json::from_str(&to_line(&m)).unwrap();
        let orig: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(back, orig, "serialization is exactly the documented line");
    }
}
