//! Tool calls on both APIs, with the default model's tokenizer (Qwen2.5, whose template renders
//! `tools` and asks for `<tool_call>{json}</tool_call>`) and a fake engine scripted to answer
//! with a call: the tools and the tool history reach the engine through the template, and the
//! call comes back as structured calls, streaming and not.

use crate::support::*;
use serde_json::{Value, json};
use std::path::Path;

const CALL_TEXT: &str =
    "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
/// How HF renders the tool in the prompt: fields in order, Python's separators.
const TOOL_IN_PROMPT: &str = "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather\", \"parameters\": {\"properties\": {\"city\": {\"type\": \"string\"}}, \"type\": \"object\"}}}";
/// The conversation's earlier call and its result, as the template renders them.
const HISTORY_IN_PROMPT: &str = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n";

fn schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}})
}

/// A server on the fake engine that answers every request with `reply`.
async fn scripted(reply: &str, log: &Path) -> TestServer {
    let t = qwen();
    let ids = t.encode(reply, false, true);
    let eog: Vec<String> = t.eog_ids().iter().map(u32::to_string).collect();
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let vocab = t.vocab_size().to_string();
    start_server_with(
        qwen_path(),
        &["--vocab", &vocab, "--eog", &eog.join(","), "--reply-tokens", &ids.join(","), "--log", log.to_str().unwrap()],
    )
    .await
}

/// The prompt text the engine got for the `n`th request.
fn prompt_text(log: &Path, n: usize) -> String {
    let ids: Vec<u32> = serde_json::from_value(logged_requests(log)[n]["tokens"].clone()).unwrap();
    qwen().decode_with(&ids, true)
}

fn openai_body(stream: bool) -> Value {
    json!({"stream": stream, "max_tokens": 200,
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": schema()}}],
        "messages": [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And in Paris?"}]})
}

fn anthropic_body(stream: bool) -> Value {
    json!({"stream": stream, "max_tokens": 200,
        "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": schema()}],
        "messages": [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                         {"type": "text", "text": "And in Paris?"}]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_calls_streaming_and_not() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    let srv = scripted(CALL_TEXT, &log).await;
    let r = post(&srv, "/v1/chat/completions", openai_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "I'll check.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    let prompt = prompt_text(&log, 0);
    assert!(prompt.contains(&format!("<tools>\n{TOOL_IN_PROMPT}\n</tools>")), "{prompt}");
    assert!(prompt.contains(HISTORY_IN_PROMPT), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>user\nAnd in Paris?<|im_end|>\n<|im_start|>assistant\n"), "{prompt}");

    let r = post(&srv, "/v1/chat/completions", openai_body(true)).await;
    let (text, chunks) = chunk_texts(&r, true);
    assert_eq!(text, "I'll check.");
    assert_eq!(finish_reasons(&chunks), ["tool_calls"]);
    let streamed: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert_eq!(streamed.len(), 1);
    assert_eq!(streamed[0]["index"], 0);
    assert_eq!(streamed[0]["function"]["name"], "get_weather");
    assert_eq!(streamed[0]["function"]["arguments"], calls[0]["function"]["arguments"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_use_streaming_and_not() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    let srv = scripted(CALL_TEXT, &log).await;
    let r = post(&srv, "/v1/messages", anthropic_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["stop_reason"], "tool_use");
    let content = v["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[0], json!({"type": "text", "text": "I'll check."}));
    assert_eq!(content[1]["type"], "tool_use");
    assert!(content[1]["id"].as_str().unwrap().starts_with("toolu"));
    assert_eq!(content[1]["name"], "get_weather");
    assert_eq!(content[1]["input"], json!({"city": "Paris"}));
    // The same conversation in either API is the same prompt.
    let r = post(&srv, "/v1/chat/completions", openai_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let logged = logged_requests(&log);
    assert_eq!(logged[0]["tokens"], logged[1]["tokens"]);

    let r = post(&srv, "/v1/messages", anthropic_body(true)).await;
    // Text deltas come per token: one run of them.
    let events: Vec<(String, Value)> = r.events();
    let text: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "I'll check.");
    let events: Vec<(String, Value)> = events.into_iter().filter(|(_, d)| d["delta"]["type"] != "text_delta").collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{}",
        r.body
    );
    assert_eq!(events[2].1["index"], 0);
    let start = &events[4].1;
    assert_eq!(start["index"], 1);
    assert_eq!(start["content_block"]["type"], "tool_use");
    assert_eq!(start["content_block"]["name"], "get_weather");
    assert_eq!(start["content_block"]["input"], json!({}));
    let delta = &events[5].1["delta"];
    assert_eq!(delta["type"], "input_json_delta");
    let input: Value = serde_json::from_str(delta["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"city": "Paris"}));
    assert_eq!(events[6].1["index"], 1);
    assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_forces_or_removes_tools() {
    let dir = scratch_dir();
    let log = dir.join("requests.jsonl");
    // The rest of a call whose opening the server put in the prompt.
    let srv = scripted("{\"city\": \"Paris\"}}\n</tool_call>", &log).await;
    let mut body = anthropic_body(false);
    body["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    let r = post(&srv, "/v1/messages", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    assert_eq!(v["content"][0]["input"], json!({"city": "Paris"}));
    assert!(
        prompt_text(&log, 0)
            .ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ")
    );

    let mut body = openai_body(false);
    body["tool_choice"] = json!("required");
    post(&srv, "/v1/chat/completions", body).await;
    assert!(prompt_text(&log, 1).ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \""));

    // "none": no tools in the prompt, nothing parsed (the history is still rendered).
    let mut body = openai_body(false);
    body["tool_choice"] = json!("none");
    let r = post(&srv, "/v1/chat/completions", body).await;
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["content"], "{\"city\": \"Paris\"}}\n</tool_call>");
    let prompt = prompt_text(&log, 2);
    assert!(!prompt.contains("<tools>") && prompt.contains(HISTORY_IN_PROMPT), "{prompt}");

    let bad = [
        ("/v1/chat/completions", json!({"type": "function", "function": {"name": "nope"}})),
        ("/v1/chat/completions", json!("sometimes")),
        ("/v1/messages", json!({"type": "tool", "name": "nope"})),
        ("/v1/messages", json!({"type": "tool"})),
    ];
    for (path, choice) in bad {
        let mut body = if path == "/v1/messages" { anthropic_body(false) } else { openai_body(false) };
        body["tool_choice"] = choice;
        let r = post(&srv, path, body).await;
        assert_eq!(r.status, 400, "{}", r.body);
    }
    let mut body = openai_body(false);
    body["tools"][0]["function"]["parameters"] = json!("not a schema");
    assert_eq!(post(&srv, "/v1/chat/completions", body).await.status, 400);
    let mut body = openai_body(false);
    body["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    assert_eq!(post(&srv, "/v1/chat/completions", body).await.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_without_tool_support_gets_a_clear_400() {
    let srv = start_server(&[]).await; // Gemma 3: its template knows no tools
    let r = post(&srv, "/v1/chat/completions", openai_body(false)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("does not support tools"), "{v}");
    let r = post(&srv, "/v1/messages", anthropic_body(false)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("does not support tools"));
}
