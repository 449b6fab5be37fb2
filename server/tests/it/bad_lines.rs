//! Bad host lines on the engine's stdin (issue 14 item 6): bytes that are not UTF-8, two
//! requests on one line, fields of the wrong type. Each is an error reply for the request it
//! names (or one unattributed `error` line), and the loop goes on serving.

use server::protocol::*;
use std::io::{BufRead, Cursor};

/// Emits 100, 101, ... until told to stop.
struct Echo;

impl TokenEngine for Echo {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            name: "echo".into(),
            vocab_size: 1000,
            context_length: 64,
            eog_tokens: vec![],
            parallel: 1,
            engine: None,
        }
    }
    fn generate(&mut self, _req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String> {
        for i in 0.. {
            if !emit(100 + i) {
                break;
            }
        }
        Ok(FinishReason::Stop)
    }
}

fn run(input: &[u8]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    serve_loop(&mut Echo, Cursor::new(input.to_vec()), &mut out).expect("serve_loop goes on");
    out.lines().map(|l| serde_json::from_str(&l.unwrap()).expect("every output line is JSON")).collect()
}

fn dones(lines: &[serde_json::Value], id: u64) -> Vec<&serde_json::Value> {
    lines.iter().filter(|l| l["type"] == "done" && l["id"] == id).collect()
}

fn error_of(lines: &[serde_json::Value], id: u64) -> String {
    let d = dones(lines, id);
    assert_eq!(d.len(), 1, "one done for {id}: {lines:?}");
    assert_eq!(d[0]["reason"], "error", "{}", d[0]);
    d[0]["error"].as_str().unwrap().to_string()
}

fn ok(id: u64, max_tokens: u32) -> String {
    format!("{{\"type\":\"generate\",\"id\":{id},\"tokens\":[1],\"max_tokens\":{max_tokens}}}\n")
}

#[test]
fn a_line_that_is_not_utf8_is_an_error_and_the_loop_goes_on() {
    let mut input = ok(1, 2).into_bytes();
    input.extend_from_slice(b"\xff\n"); // one bad byte: no id to read
    input.extend_from_slice(b"{\"type\":\"generate\",\"id\":2,\"tokens\":[1],\"max_tokens\":1}\xfe\n");
    input.extend_from_slice(b"{\"type\":\"generate\",\"id\":3,\"tokens\":[1],\"max\xc3\x28\":1}\r\n");
    input.extend_from_slice(ok(4, 3).as_bytes());
    let lines = run(&input);
    assert_eq!(lines[0]["type"], "hello");
    // Requests read before and after the bad lines are served.
    assert_eq!(dones(&lines, 1)[0]["generated_tokens"], 2);
    assert_eq!(dones(&lines, 4)[0]["generated_tokens"], 3);
    let anonymous: Vec<_> = lines.iter().filter(|l| l["type"] == "error").collect();
    assert_eq!(anonymous.len(), 1, "{lines:?}");
    assert_eq!(anonymous[0]["error"], "malformed request: the line is not valid UTF-8 (byte 0xff at offset 0)");
    // A bad line whose id can be read fails that request.
    assert_eq!(error_of(&lines, 2), "malformed request: the line is not valid UTF-8 (byte 0xfe at offset 54)");
    assert!(error_of(&lines, 3).contains("not valid UTF-8 (byte 0xc3 at offset 43)"));
}

#[test]
fn invalid_utf8_parses_to_one_error() {
    let r = parse_host_bytes(b"\x80");
    assert_eq!(r.len(), 1);
    assert!(matches!(&r[0], Err((None, e)) if e.contains("not valid UTF-8 (byte 0x80 at offset 0)")));
    assert!(parse_host_bytes(b"  ").is_empty());
    assert!(parse_host_bytes(b"").is_empty());
}

#[test]
fn two_requests_on_one_line_fail_both_ids() {
    let two = "{\"type\":\"generate\",\"id\":5,\"tokens\":[1],\"max_tokens\":1}{\"type\":\"generate\",\"id\":6,\"tokens\":[1],\"max_tokens\":1}\n";
    let with_junk = "{\"type\":\"generate\",\"id\":7,\"tokens\":[1],\"max_tokens\":1} x\n";
    let input = format!("{two}{with_junk}{}", ok(8, 1));
    let lines = run(input.as_bytes());
    for id in [5, 6] {
        assert_eq!(error_of(&lines, id), "malformed request: 2 JSON values on one line (one request per line)");
    }
    assert_eq!(
        error_of(&lines, 7),
        "malformed request: unexpected characters after the JSON value at column 56 (one request per line)"
    );
    assert_eq!(dones(&lines, 8)[0]["reason"], "length");
    assert!(lines.iter().all(|l| l["type"] != "error"), "{lines:?}");
    assert!(lines.iter().all(|l| l["type"] != "token" || l["id"] == 8), "{lines:?}");
}

#[test]
fn type_errors_name_the_field() {
    let cases = [
        (
            r#"{"type":"generate","id":1,"tokens":[1],"max_tokens":-5}"#,
            "field `max_tokens`: invalid value: integer `-5`, expected u32",
        ),
        (
            r#"{"type":"generate","id":1,"tokens":[1,"a"],"max_tokens":1}"#,
            "field `tokens[1]`: invalid type: string \"a\", expected u32",
        ),
        (
            r#"{"type":"generate","id":1,"tokens":[1],"max_tokens":1,"sampling":{"top_k":1.5}}"#,
            "field `sampling.top_k`: invalid type: floating point `1.5`, expected u32",
        ),
        (
            r#"{"type":"generate","id":1,"tokens":[1],"max_tokens":1,"sampling":{"seed":-1}}"#,
            "field `sampling.seed`: invalid value: integer `-1`, expected u64",
        ),
        (
            r#"{"type":"generate","id":1,"tokens":[1],"max_tokens":1,"stop_tokens":7}"#,
            "field `stop_tokens`: invalid type: integer `7`, expected a sequence",
        ),
        (r#"{"type":"generate","id":1,"tokens":[1]}"#, "missing field `max_tokens`"),
        (r#"{"type":"cancel","id":"x"}"#, "field `id`: invalid type: string \"x\", expected u64"),
    ];
    for (line, want) in cases {
        let got = match parse_host_line(line) {
            Err((_, e)) => e,
            Ok(m) => panic!("{line}: parsed as {m:?}"),
        };
        assert_eq!(got, format!("malformed request: {want}"), "{line}");
        let bytes = parse_host_bytes(line.as_bytes());
        assert!(matches!(&bytes[..], [Err((_, e))] if *e == got), "{line}: {bytes:?}");
    }
    // The id is still salvaged for the done line.
    assert!(matches!(parse_host_line(r#"{"type":"generate","id":9,"tokens":[1],"max_tokens":-5}"#), Err((Some(9), _))));
}

/// HTTP bodies: a value of the wrong type names its field too, trailing characters are still
/// refused, and bytes that are not UTF-8 are a 400 with serde's position.
#[test]
fn http_body_type_errors_name_the_field() {
    use server::openai::{ChatRequest, CompletionRequest, parse_body};
    let msg = |r: Result<ChatRequest, server::openai::ApiError>| r.expect_err("refused").message;
    assert_eq!(
        msg(parse_body(br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":-1}"#)),
        "invalid request body: field `max_tokens`: invalid value: integer `-1`, expected u32 at line 1 column 61"
    );
    assert!(
        msg(parse_body(br#"{"messages":[{"role":"user","content":"hi"}]} x"#))
            .starts_with("invalid request body: trailing characters")
    );
    let m = msg(parse_body(b"{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}"));
    assert_eq!(m, "invalid request body: field `messages[0].content`: invalid unicode code point at line 1 column 43");
    let c: Result<CompletionRequest, _> = parse_body(br#"{"prompt":"hi","temperature":"hot"}"#);
    assert!(
        c.err().unwrap().message.starts_with("invalid request body: field `temperature`: invalid type: string \"hot\"")
    );
}

/// Issue 39 item 2: a line that is no JSON at all but whose id can be read (a number out of
/// range, a byte order mark, a cut-off line, nesting past serde_json's limit) ends that
/// request with a `done` naming the reason, not with a bare `error` that leaves the host
/// waiting.
#[test]
fn unparsable_lines_with_a_readable_id_get_their_done() {
    let deep = format!(
        "{{\"type\":\"generate\",\"id\":25,\"tokens\":[1],\"max_tokens\":1,\"x\":{}{}}}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    let lines = [
        "\u{feff}{\"type\":\"generate\",\"id\":21,\"tokens\":[1],\"max_tokens\":1}\n",
        "{\"type\":\"generate\",\"id\":22,\"tokens\":[1],\"max_tokens\":1e999}\n",
        "{\"type\":\"generate\",\"id\":23,\"tokens\":[1e400],\"max_tokens\":1}\n",
        "{\"type\":\"generate\",\"id\":24,\"tokens\":[1,\n",
        &deep,
        "{\"type\":\"generate\",\"id\":26,\"tokens\":[1],\"max_tokens\":1}{\"id\":27,\"max_tokens\":1e999}\n",
        "{\"type\":\"generate\",\"id\":-3,\"tokens\":[1e999]}\n", // no readable id
    ];
    let mut input = lines.concat();
    input.push_str(&ok(28, 2));
    let out = run(input.as_bytes());
    assert_eq!(
        error_of(&out, 21),
        "malformed request: the line starts with a UTF-8 byte order mark (U+FEFF); send JSON \
         without one"
    );
    assert_eq!(error_of(&out, 22), "malformed request: number out of range at line 1 column 58");
    assert_eq!(error_of(&out, 23), "malformed request: number out of range at line 1 column 42");
    assert_eq!(error_of(&out, 24), "malformed request: EOF while parsing a value at line 1 column 39");
    assert_eq!(error_of(&out, 25), "malformed request: recursion limit exceeded at line 1 column 186");
    for id in [26, 27] {
        assert_eq!(
            error_of(&out, id),
            "malformed request: unexpected characters after the JSON value at column 82 (one \
             request per line)"
        );
    }
    let anonymous: Vec<_> = out.iter().filter(|l| l["type"] == "error").collect();
    assert_eq!(anonymous.len(), 1, "{out:?}");
    assert!(anonymous[0]["error"].as_str().unwrap().starts_with("malformed request: number out of range"), "{out:?}");
    assert_eq!(dones(&out, 28)[0]["generated_tokens"], 2);
    // The same id from `parse_host_line`, the one-line form.
    let bom = "\u{feff}{\"type\":\"cancel\",\"id\":9}";
    assert!(matches!(parse_host_line(bom), Err((Some(9), _))));
}
