//! OpenAI's API: `/v1/completions` and `/v1/chat/completions` — what we accept, and the
//! generation's pieces in OpenAI's response and chunk shapes.
//!
//! Unknown fields are ignored, as OpenAI-compatible servers commonly do, so clients that send
//! e.g. `user` or `logit_bias: {}` keep working. Fields we cannot honour and that change the
//! meaning of the answer (`n > 1`) are rejected with 400.

use crate::chat::{Conversation, ToolChoice, ToolDef, Turn, TurnCall};
use crate::engine_process::Generation;
use crate::error::read_body;
pub use crate::error::{ApiError, parse_body};
use crate::generate::{self, EventSink, Finish, GenParams, Job};
use crate::http::{AppState, now};
use crate::tools::{ParsedCall, Piece, ToolCallParser};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// Parameters shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    /// Chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extensions (llama.cpp server names).
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    /// Negative = random (llama.cpp uses -1).
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
}

impl CommonParams {
    fn gen_params(&self) -> Result<GenParams, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only n = 1 is supported"));
        }
        Ok(GenParams {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            temperature: self.temperature,
            temperature_max: 2.0,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
            stops: match &self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s.clone()],
                Some(Stop::Many(v)) => v.clone(),
            },
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub params: CommonParams,
}

/// `prompt`: a string, one-element list of strings, or token ids (as OpenAI allows). Read
/// by [`Prompt::from_value`], whose errors name the element that is wrong.
#[derive(Debug)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        Prompt::from_value(Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl Prompt {
    /// The prompt, or what is wrong with it (`prompt[1]: -5 is not a token id ...`).
    pub fn from_value(v: Value) -> Result<Prompt, String> {
        const SHAPES: &str = "a string, a list of strings, a list of token ids or a list of token id lists";
        let items = match v {
            Value::String(s) => return Ok(Prompt::Text(s)),
            Value::Array(items) => items,
            other => return Err(format!("prompt must be {SHAPES}, not {}", kind(&other))),
        };
        match items.first() {
            // `[]`: no tokens (the empty prompt is refused later, with the other kinds).
            None | Some(Value::Number(_)) => token_ids(&items, "prompt").map(Prompt::Tokens),
            Some(Value::String(_)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s),
                    other => Err(format!("prompt[{i}]: expected a string like prompt[0], got {}", kind(&other))),
                })
                .collect::<Result<_, _>>()
                .map(Prompt::Texts),
            Some(Value::Array(_)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Array(ids) => token_ids(ids, &format!("prompt[{i}]")),
                    other => {
                        Err(format!("prompt[{i}]: expected a list of token ids like prompt[0], got {}", kind(other)))
                    }
                })
                .collect::<Result<_, _>>()
                .map(Prompt::TokenLists),
            Some(other) => Err(format!(
                "prompt[0]: expected a string or a token id, got {} (prompt must be {SHAPES})",
                kind(other)
            )),
        }
    }
}

/// Token ids (vocabulary ranges are checked later, against the model's).
fn token_ids(items: &[Value], path: &str) -> Result<Vec<u32>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| match v {
                Value::Number(n) => format!(
                    "{path}[{i}]: {n} is not a token id (token ids are integers from 0 to \
                         the vocabulary size - 1)"
                ),
                other => format!("{path}[{i}]: expected a token id (an integer), got {}", kind(other)),
            })
        })
        .collect()
}

/// What a JSON value is, for errors.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    pub tools: Option<Vec<ToolIn>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(flatten)]
    pub params: CommonParams,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// Assistant turns: the calls it made.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// Tool turns: the call answered.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// A JSON string, as OpenAI sends it (an object is accepted too).
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// Message content: a string or a list of parts, of which only `text` parts are supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    pub fn into_text(self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => out.push_str(&t),
                        (k, _) => {
                            return Err(ApiError::bad_request(format!("unsupported content part type {k:?}")));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

impl ChatRequest {
    /// The messages in the template's format, with the tools and the tool choice.
    fn conversation(self) -> Result<Conversation, ApiError> {
        let mut turns = Vec::with_capacity(self.messages.len());
        for m in self.messages {
            let role = match m.role.as_str() {
                "developer" => "system", // OpenAI's newer name for the system prompt
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown message role {other:?} (system, developer, user, assistant, tool)"
                    )));
                }
            };
            let content = match m.content {
                Some(c) => c.into_text()?,
                None => String::new(),
            };
            let mut turn = Turn::new(role, content);
            for call in m.tool_calls.unwrap_or_default() {
                if role != "assistant" {
                    return Err(ApiError::bad_request("only assistant messages have tool_calls"));
                }
                let arguments = call_arguments(call.function.arguments)?;
                turn.tool_calls.push(TurnCall::new(call.id, call.function.name, arguments));
            }
            if role == "tool" {
                turn.tool_call_id = m.tool_call_id;
            }
            turns.push(turn);
        }
        let mut tools = Vec::new();
        for t in self.tools.unwrap_or_default() {
            if t.kind != "function" {
                return Err(ApiError::bad_request(format!("unsupported tool type {:?} (only \"function\")", t.kind)));
            }
            let f = t.function;
            tools.push(ToolDef::new(f.name, f.description, f.parameters)?);
        }
        let tool_choice = match self.tool_choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                _ => return Err(bad_tool_choice()),
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if v["type"] == "function" => ToolChoice::Named(name.to_string()),
                _ => return Err(bad_tool_choice()),
            },
        };
        // OpenAI answers these with "'tool_choice' is only allowed when 'tools' are specified".
        let forced = match &tool_choice {
            ToolChoice::Required => Some("\"required\"".to_string()),
            ToolChoice::Named(name) => {
                Some(format!("{{\"type\": \"function\", \"function\": {{\"name\": {}}}}}", Value::from(name.as_str())))
            }
            ToolChoice::None | ToolChoice::Auto => None,
        };
        if let Some(choice) = forced.filter(|_| tools.is_empty()) {
            return Err(ApiError::bad_request(format!(
                "tool_choice {choice} requires a tool call, but the request has no `tools`: add \
                 the tools the model may call, or drop tool_choice"
            )));
        }
        Ok(Conversation { turns, tools, tool_choice, assistant_prefix: String::new() })
    }
}

fn bad_tool_choice() -> ApiError {
    ApiError::bad_request(
        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
    )
}

/// OpenAI sends arguments as a JSON string; templates want the object.
fn call_arguments(arguments: Option<Value>) -> Result<Value, ApiError> {
    match arguments {
        None | Some(Value::Null) => Ok(json!({})),
        Some(Value::String(s)) => serde_json::from_str(&s)
            .map_err(|e| ApiError::bad_request(format!("tool call arguments are not JSON ({e}): {s:?}"))),
        Some(v) => Ok(v),
    }
}

pub async fn completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let req: CompletionRequest = parse_body(&read_body(body)?)?;
        let prompt = match req.prompt {
            Prompt::Text(t) => st.tokenize(&t),
            Prompt::Texts(v) if v.len() == 1 => st.tokenize(&v[0]),
            Prompt::Tokens(t) => t,
            Prompt::TokenLists(mut v) if v.len() == 1 => v.remove(0),
            _ => {
                return Err(ApiError::bad_request("only one prompt per request is supported"));
            }
        };
        let job = generate::make_job(&st, prompt, req.params.gen_params()?).await?;
        Ok(run(st.clone(), job, &req.params, None, Kind::Completion).await)
    };
    result.await.unwrap_or_else(|e: ApiError| e.into_response())
}

pub async fn chat_completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let mut req: ChatRequest = parse_body(&read_body(body)?)?;
        let params = std::mem::take(&mut req.params);
        let prompt = req.conversation()?.render(&st)?;
        let job = generate::make_job(&st, prompt.tokens, params.gen_params()?).await?;
        Ok(run(st.clone(), job, &params, prompt.parser, Kind::Chat).await)
    };
    result.await.unwrap_or_else(|e: ApiError| e.into_response())
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

/// OpenAI's form of a call the model made.
fn tool_call_json(st: &AppState, call: &ParsedCall) -> Value {
    json!({"id": st.next_id("call"), "type": "function",
           "function": {"name": call.name, "arguments": Value::Object(call.arguments.clone()).to_string()}})
}

fn finish_reason(finish: &Finish, calls: usize) -> &'static str {
    if calls > 0 { "tool_calls" } else { finish.openai_reason() }
}

async fn run(
    st: Arc<AppState>,
    job: Job,
    params: &CommonParams,
    parser: Option<ToolCallParser>,
    kind: Kind,
) -> Response {
    let generation = match generate::start(&st, &job).await {
        Ok(g) => g,
        Err(e) => return e.into_response(),
    };
    let queue = generate::QueueInfo::of(&generation);
    let mut resp = respond(st, job, params, parser, kind, generation).await;
    queue.apply(&mut resp);
    resp
}

/// The answer to a request the engine has started.
async fn respond(
    st: Arc<AppState>,
    job: Job,
    params: &CommonParams,
    parser: Option<ToolCallParser>,
    kind: Kind,
    generation: Generation,
) -> Response {
    let id = st.next_id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" });
    let (created, model) = (now(), st.model_name());
    let prompt_tokens = job.prompt.len() as u32;
    let usage = move |f: &Finish| {
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": f.completion_tokens,
               "total_tokens": prompt_tokens + f.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": f.cached_tokens}})
    };
    if !params.stream {
        let (mut text, mut calls) = (String::new(), Vec::new());
        let on_piece = |piece| {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push(tool_call_json(&st, &c)),
            }
            true
        };
        let finish = match generate::drive_pieces(&st, generation, job.stops, parser, on_piece).await {
            Ok(f) => f,
            Err(e) => return e.into_response(),
        };
        let reason = finish_reason(&finish, calls.len());
        let (object, choice) = match kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = Value::Array(calls);
                }
                let choice = json!({"index": 0, "message": message, "finish_reason": reason, "logprobs": null});
                ("chat.completion", choice)
            }
            Kind::Completion => {
                let choice = json!({"index": 0, "text": text, "finish_reason": reason, "logprobs": null});
                ("text_completion", choice)
            }
        };
        return Json(json!({"id": id, "object": object, "created": created, "model": model,
                           "choices": [choice], "usage": usage(&finish),
                           "timings": finish.timings}))
        .into_response();
    }

    let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    // One chunk: a chat `delta` (role, content or tool_calls) or a completion's text.
    let chunk = move |delta: Value, finish: Option<&str>| -> Value {
        let choice = match kind {
            Kind::Chat => {
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Completion => {
                let text = delta.get("content").cloned().unwrap_or(json!(""));
                json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": null})
            }
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    let include_usage = params.stream_options.as_ref().is_some_and(|o| o.include_usage);
    generate::sse_response(move |tx: EventSink| async move {
        let send = |v: Value| tx.send(Ok(Event::default().data(v.to_string()))).is_ok();
        if kind == Kind::Chat && !send(chunk(json!({"role": "assistant", "content": ""}), None)) {
            return;
        }
        let mut calls = 0;
        let on_piece = |piece| match piece {
            Piece::Text(t) => send(chunk(json!({"content": t}), None)),
            Piece::Call(c) => {
                let mut call = tool_call_json(&st, &c);
                call["index"] = calls.into();
                calls += 1;
                send(chunk(json!({"tool_calls": [call]}), None))
            }
        };
        match generate::drive_pieces(&st, generation, job.stops, parser, on_piece).await {
            Ok(f) => {
                let mut last = chunk(json!({}), Some(finish_reason(&f, calls)));
                last["timings"] = f.timings.clone();
                send(last);
                if include_usage {
                    let mut u = chunk(json!({}), None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&f);
                    send(u);
                }
                let _ = tx.send(Ok(Event::default().data("[DONE]")));
            }
            // OpenAI clients raise on a data chunk carrying `error`; no [DONE] after it.
            Err(e) => {
                send(e.body());
            }
        }
    })
}
