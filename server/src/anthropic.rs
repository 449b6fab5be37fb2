//! Anthropic's Messages API: `POST /v1/messages` (and `/v1/messages/count_tokens`) — the request
//! translated into a conversation for the chat template, the generation's pieces in Anthropic's
//! message and event shapes, errors as `{"type": "error", "error": {...}}`.
//!
//! Unknown fields are ignored (`metadata`, `anthropic-version`, ...); content blocks the server
//! cannot honour (images, documents, thinking) are a 400, not silently dropped.

use crate::chat::{Conversation, ToolChoice, ToolDef, Turn, TurnCall};
use crate::engine_process::Generation;
use crate::error::{Anthropic, ApiError, parse_body, read_body};
use crate::generate::{self, Ending, EventSink, Finish, GenParams, Job};
use crate::http::AppState;
use crate::tools::{CALL_CLOSE, ParsedCall, Piece, ToolCallParser};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// Required by `/v1/messages` (checked there), not by `count_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    pub messages: Vec<MessageIn>,
    /// A string or a list of text blocks.
    #[serde(default)]
    pub system: Option<Value>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceIn>,
    /// Extensions with llama.cpp's names, as on the OpenAI endpoints.
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub repeat_last_n: Option<u32>,
    #[serde(default)]
    pub seed: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    /// A string or a list of content blocks.
    pub content: Value,
}

/// A content block as sent; which fields are required depends on `type`.
#[derive(Debug, Deserialize)]
struct BlockIn {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    tool_use_id: Option<String>,
    /// A tool result: a string or text blocks.
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Deserialize)]
pub struct ToolIn {
    /// Absent or `"custom"` for client tools; Anthropic's server tools are not available here.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ToolChoiceIn {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub disable_parallel_tool_use: bool,
}

/// Content as blocks: a string is one text block.
fn blocks(content: Value, what: &str) -> Result<Vec<BlockIn>, ApiError> {
    match content {
        Value::String(text) => Ok(vec![BlockIn {
            kind: "text".into(),
            text: Some(text),
            id: None,
            name: None,
            input: None,
            tool_use_id: None,
            content: None,
            is_error: false,
        }]),
        v @ Value::Array(_) => serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("{what}: {e}"))),
        _ => Err(ApiError::bad_request(format!("{what} must be a string or a list of content blocks"))),
    }
}

/// The text of blocks that may only be text (system prompt, tool results).
fn text_only(content: Value, what: &str) -> Result<String, ApiError> {
    let mut out = String::new();
    for b in blocks(content, what)? {
        match (b.kind.as_str(), b.text) {
            ("text", Some(t)) => out.push_str(&t),
            (k, _) => {
                return Err(ApiError::bad_request(format!(
                    "{what}: content block type {k:?} is not supported here (only \"text\")"
                )));
            }
        }
    }
    Ok(out)
}

impl MessagesRequest {
    fn gen_params(&self) -> GenParams {
        let mut stops = self.stop_sequences.clone().unwrap_or_default();
        if self.tool_choice.as_ref().is_some_and(|c| c.disable_parallel_tool_use) {
            stops.push(CALL_CLOSE.into()); // one call, then stop (the parser closes it)
        }
        GenParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            temperature_max: 1.0,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
            stops,
        }
    }

    /// The conversation for the template: `system` first, `tool_result` blocks as `tool`
    /// turns, `tool_use` blocks as the assistant's calls; a final assistant turn is the text
    /// the answer continues from.
    fn conversation(&mut self) -> Result<Conversation, ApiError> {
        let mut conv = Conversation::default();
        if let Some(system) = self.system.take() {
            conv.turns.push(Turn::new("system", text_only(system, "system")?));
        }
        let n = self.messages.len();
        if n == 0 {
            return Err(ApiError::bad_request("messages: at least one message is required"));
        }
        let mut has_user = false;
        for (i, m) in std::mem::take(&mut self.messages).into_iter().enumerate() {
            let whole = format!("messages[{i}].content");
            // Blocks are named by their index, unless the content was one string.
            let indexed = m.content.is_array();
            let content = blocks(m.content, &whole)?;
            let at = |j: usize| {
                if indexed { format!("{whole}[{j}]") } else { whole.clone() }
            };
            match m.role.as_str() {
                "user" => {
                    has_user = true;
                    let mut text = String::new();
                    for (j, b) in content.into_iter().enumerate() {
                        let what = at(j);
                        match b.kind.as_str() {
                            "text" => text.push_str(&required(b.text, &what, "text")?),
                            "tool_result" => {
                                let id = required(b.tool_use_id, &what, "tool_use_id")?;
                                let mut result = match b.content {
                                    None => String::new(),
                                    Some(c) => text_only(c, &format!("{what}: tool_result"))?,
                                };
                                if b.is_error {
                                    result.insert_str(0, "Error: ");
                                }
                                let mut turn = Turn::new("tool", result);
                                turn.tool_call_id = Some(id);
                                conv.turns.push(turn);
                            }
                            "tool_use" => return Err(misplaced_block(&what, "tool_use", "user")),
                            k => return Err(unsupported_block(&what, k)),
                        }
                    }
                    if !text.is_empty() || conv.turns.last().is_none_or(|t| t.role != "tool") {
                        conv.turns.push(Turn::new("user", text));
                    }
                }
                "assistant" => {
                    let mut turn = Turn::new("assistant", String::new());
                    for (j, b) in content.into_iter().enumerate() {
                        let what = at(j);
                        match b.kind.as_str() {
                            "text" => turn.content.push_str(&required(b.text, &what, "text")?),
                            "tool_use" => turn.tool_calls.push(TurnCall::new(
                                Some(required(b.id, &what, "id")?),
                                required(b.name, &what, "name")?,
                                b.input.unwrap_or_else(|| json!({})),
                            )),
                            "tool_result" => {
                                return Err(misplaced_block(&what, "tool_result", "assistant"));
                            }
                            k => return Err(unsupported_block(&what, k)),
                        }
                    }
                    if i + 1 == n && turn.tool_calls.is_empty() {
                        // Prefill: the answer continues this text.
                        conv.assistant_prefix = turn.content;
                    } else {
                        conv.turns.push(turn);
                    }
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "messages[{i}].role must be \"user\" or \"assistant\", got {other:?}"
                    )));
                }
            }
        }
        if !has_user {
            // The API's own rule too: the first message must use the user role.
            return Err(ApiError::bad_request(
                "messages: the conversation has no user message: it must start with a user turn \
                 (a trailing assistant message only prefills the answer to one)",
            ));
        }
        for t in self.tools.take().unwrap_or_default() {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::bad_request(format!(
                    "tool {:?}: tool type {kind:?} is not supported (only client tools)",
                    t.name
                )));
            }
            conv.tools.push(ToolDef::new(t.name, t.description, t.input_schema)?);
        }
        conv.tool_choice = match self.tool_choice.as_ref() {
            None => ToolChoice::Auto,
            Some(c) => match (c.kind.as_str(), &c.name) {
                ("auto", _) => ToolChoice::Auto,
                ("any", _) => ToolChoice::Required,
                ("none", _) => ToolChoice::None,
                ("tool", Some(name)) => ToolChoice::Named(name.clone()),
                _ => {
                    return Err(ApiError::bad_request(
                        "tool_choice.type must be \"auto\", \"any\", \"none\" or \"tool\" (with `name`)",
                    ));
                }
            },
        };
        if conv.tools.is_empty() {
            let forced = match &conv.tool_choice {
                ToolChoice::Required => Some("{\"type\": \"any\"}".to_string()),
                ToolChoice::Named(name) => {
                    Some(format!("{{\"type\": \"tool\", \"name\": {}}}", Value::from(name.as_str())))
                }
                ToolChoice::None | ToolChoice::Auto => None,
            };
            if let Some(choice) = forced {
                return Err(ApiError::bad_request(format!(
                    "tool_choice {choice} requires a tool call, but the request has no `tools`: \
                     add the tools the model may call, or drop tool_choice"
                )));
            }
        }
        Ok(conv)
    }
}

fn required<T>(v: Option<T>, what: &str, field: &str) -> Result<T, ApiError> {
    v.ok_or_else(|| ApiError::bad_request(format!("{what}: a block is missing `{field}`")))
}

fn unsupported_block(what: &str, kind: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{what}: content block type {kind:?} is not supported (user turns: text, tool_result; \
         assistant turns: text, tool_use)"
    ))
}

/// A block of a type that exists, in the wrong turn.
fn misplaced_block(what: &str, kind: &str, role: &str) -> ApiError {
    let (belongs, why) = match kind {
        "tool_use" => ("an assistant", "it is a call the model made"),
        _ => ("a user", "it answers a call the model made"),
    };
    let role = if role == "user" { "a user" } else { "an assistant" };
    ApiError::bad_request(format!("{what}: a {kind} block belongs in {belongs} message ({why}), not in {role} message"))
}

/// `stop_reason` and `stop_sequence`.
fn stop_reason(finish: &Finish, calls: usize) -> (&'static str, Option<String>) {
    match &finish.ending {
        _ if calls > 0 => ("tool_use", None),
        Ending::EndOfGeneration => ("end_turn", None),
        Ending::StopString(s) => ("stop_sequence", Some(s.clone())),
        Ending::Length => ("max_tokens", None),
    }
}

fn tool_use_block(st: &AppState, call: ParsedCall) -> Value {
    json!({"type": "tool_use", "id": st.next_id("toolu"), "name": call.name,
           "input": Value::Object(call.arguments)})
}

pub async fn messages(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(st, body).await.unwrap_or_else(|e| Anthropic(e).into_response())
}

pub async fn count_tokens(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let count = || {
        let mut req: MessagesRequest = parse_body(&read_body(body)?)?;
        let prompt = req.conversation()?.render(&st)?;
        Ok(Json(json!({"input_tokens": prompt.tokens.len()})).into_response())
    };
    count().unwrap_or_else(|e: ApiError| Anthropic(e).into_response())
}

async fn run(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let mut req: MessagesRequest = parse_body(&read_body(body)?)?;
    match req.max_tokens {
        None => return Err(ApiError::bad_request("max_tokens: field required")),
        Some(0) => return Err(ApiError::bad_request("max_tokens must be at least 1")),
        Some(_) => {}
    }
    let prompt = req.conversation()?.render(&st)?;
    let job = generate::make_job(&st, prompt.tokens, req.gen_params()).await?;
    let generation = generate::start(&st, &job).await?;
    let queue = generate::QueueInfo::of(&generation);
    let mut resp =
        respond(st, req, job, prompt.parser, generation).await.unwrap_or_else(|e| Anthropic(e).into_response());
    queue.apply(&mut resp);
    Ok(resp)
}

/// The answer to a request the engine has started.
async fn respond(
    st: Arc<AppState>,
    req: MessagesRequest,
    job: Job,
    parser: Option<ToolCallParser>,
    generation: Generation,
) -> Result<Response, ApiError> {
    let (id, model) = (st.next_id("msg"), st.model_name());
    let input_tokens = job.prompt.len();

    if !req.stream {
        let mut content: Vec<Value> = Vec::new();
        let mut calls = 0;
        let on_piece = |piece| {
            match piece {
                Piece::Text(t) => match content.last_mut() {
                    Some(b) if b["type"] == "text" => {
                        let joined = format!("{}{t}", b["text"].as_str().unwrap_or(""));
                        b["text"] = joined.into();
                    }
                    _ => content.push(json!({"type": "text", "text": t})),
                },
                Piece::Call(c) => {
                    calls += 1;
                    content.push(tool_use_block(&st, c));
                }
            }
            true
        };
        let finish = generate::drive_pieces(&st, generation, job.stops, parser, on_piece).await?;
        if content.is_empty() {
            content.push(json!({"type": "text", "text": ""}));
        }
        let (reason, sequence) = stop_reason(&finish, calls);
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": input_tokens.saturating_sub(finish.cached_tokens as usize), "cache_read_input_tokens": finish.cached_tokens, "output_tokens": finish.completion_tokens},
        }))
        .into_response());
    }

    Ok(generate::sse_response(move |tx: EventSink| async move {
        let send = |name: &str, data: Value| tx.send(Ok(Event::default().event(name).data(data.to_string()))).is_ok();
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
        if !send("message_start", start) || !send("ping", json!({"type": "ping"})) {
            return;
        }
        let mut blocks = BlockStream::default();
        let on_piece = |piece| blocks.piece(&st, piece, &send);
        let result = generate::drive_pieces(&st, generation, job.stops, parser, on_piece).await;
        match result {
            Ok(finish) => {
                blocks.end(&send);
                let (reason, sequence) = stop_reason(&finish, blocks.calls);
                send(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"input_tokens": input_tokens.saturating_sub(finish.cached_tokens as usize), "cache_read_input_tokens": finish.cached_tokens, "output_tokens": finish.completion_tokens}}),
                );
                send("message_stop", json!({"type": "message_stop"}));
            }
            // Headers are sent: the error is an `error` event (the SDK raises on it).
            Err(e) => {
                send("error", e.anthropic_body());
            }
        }
    }))
}

/// The content blocks of a streamed message: text pieces go into an open text block; a call
/// closes it and is a `tool_use` block of its own (start, its input as one JSON delta, stop).
#[derive(Default)]
struct BlockStream {
    next_index: usize,
    open_text: Option<usize>,
    calls: usize,
}

impl BlockStream {
    fn piece(&mut self, st: &AppState, piece: Piece, send: &impl Fn(&str, Value) -> bool) -> bool {
        match piece {
            Piece::Text(text) => {
                let index = match self.open_text {
                    Some(i) => i,
                    None => {
                        let i = self.open(json!({"type": "text", "text": ""}), send);
                        self.open_text = Some(i);
                        i
                    }
                };
                send(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text}}),
                )
            }
            Piece::Call(call) => {
                if let Some(i) = self.open_text.take() {
                    stop_block(i, send);
                }
                self.calls += 1;
                let input = Value::Object(call.arguments.clone()).to_string();
                let mut block = tool_use_block(st, call);
                block["input"] = json!({});
                let i = self.open(block, send);
                send(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": input}}),
                );
                stop_block(i, send)
            }
        }
    }

    fn open(&mut self, block: Value, send: &impl Fn(&str, Value) -> bool) -> usize {
        let index = self.next_index;
        self.next_index += 1;
        send(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
            "content_block": block}),
        );
        index
    }

    /// Close the open block; an answer without any gets one empty text block, as the
    /// non-streaming response does.
    fn end(&mut self, send: &impl Fn(&str, Value) -> bool) {
        if let Some(i) = self.open_text.take() {
            stop_block(i, send);
        } else if self.next_index == 0 {
            let i = self.open(json!({"type": "text", "text": ""}), send);
            stop_block(i, send);
        }
    }
}

fn stop_block(index: usize, send: &impl Fn(&str, Value) -> bool) -> bool {
    send("content_block_stop", json!({"type": "content_block_stop", "index": index}))
}
