//! The OpenAI-compatible HTTP server: routes, request → token job, engine events → responses.
//!
//! The server tokenizes prompts and detokenizes output itself (tokenizer from a GGUF file); the
//! engine process only sees token ids (see `protocol`). Stop strings are applied here, on the
//! detokenized text, and never sent to the client.

use crate::config::{Resolved, ServerConfig};
use crate::engine_process::{EngineEvent, EngineHandle, EngineStatus, Generation};
use crate::openai::{ApiError, ChatRequest, CommonParams, CompletionRequest, Prompt, parse_body};
use crate::protocol::{FinishReason, GenerateRequest, SamplingParams};
use crate::text::Detokenizer;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokenizer::{ChatMessage, Tokenizer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub use crate::config::ServerConfig as Config;

/// Shared state of all handlers.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// End-of-generation ids from the tokenizer, sent as `stop_tokens` with every request.
    pub eog: Vec<u32>,
    pub model_name: Option<String>,
    pub created: u64,
    counter: AtomicU64,
}

/// Load the tokenizer, start the engine and serve until Ctrl-C.
pub async fn run_server(cfg: ServerConfig) -> anyhow::Result<()> {
    let resolved = cfg.resolve()?;
    let listener = tokio::net::TcpListener::bind((resolved.host.as_str(), resolved.port))
        .await
        .map_err(|e| {
            anyhow::anyhow!("cannot listen on {}:{}: {e}", resolved.host, resolved.port)
        })?;
    let state = build_state(&resolved)?;
    // The line tests and scripts wait for; keep its shape.
    eprintln!(
        "strata server: listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// [`run_server`] on its own tokio runtime, for callers without one (the `strata` CLI).
pub fn run_server_blocking(cfg: ServerConfig) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the tokio runtime: {e}"))?
        .block_on(run_server(cfg))
}

/// Tokenizer + engine supervisor for a resolved config (the engine starts in the background).
pub fn build_state(cfg: &Resolved) -> anyhow::Result<Arc<AppState>> {
    let gguf = gguf::GgufFile::open(&cfg.tokenizer)
        .map_err(|e| anyhow::anyhow!("opening tokenizer GGUF {}: {e}", cfg.tokenizer.display()))?;
    let tokenizer = Tokenizer::from_gguf(&gguf)
        .map_err(|e| anyhow::anyhow!("loading tokenizer from {}: {e}", cfg.tokenizer.display()))?;
    let eog = tokenizer.eog_ids();
    let engine = EngineHandle::spawn(
        cfg.executable.clone(),
        cfg.args.clone(),
        cfg.startup_timeout,
        cfg.engine_timeout,
    );
    Ok(Arc::new(AppState {
        engine,
        tokenizer: Arc::new(tokenizer),
        eog,
        model_name: cfg.model_name.clone(),
        created: now(),
        counter: AtomicU64::new(0),
    }))
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(state)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    fn model_name(&self) -> String {
        if let Some(n) = &self.model_name {
            return n.clone();
        }
        self.engine
            .info()
            .map(|i| i.name)
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "strata".into())
    }

    fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}-{}",
            self.created,
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Tokenize with specials parsed; BOS prepended once if the model wants one (chat templates
    /// often already start with it).
    fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut ids = self.tokenizer.encode(text, false, true);
        if let Some(bos) = self.tokenizer.bos().filter(|_| self.tokenizer.add_bos())
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        ids
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let (restarts, waiting, in_flight) = st.engine.counters();
    let (code, status, error) = match st.engine.status() {
        EngineStatus::Ready(_) => (StatusCode::OK, "ok", None),
        EngineStatus::Starting => (StatusCode::SERVICE_UNAVAILABLE, "loading", None),
        EngineStatus::Down { error, .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, "restarting", Some(error))
        }
    };
    let engine = st.engine.info().and_then(|i| i.engine);
    let body = json!({
        "status": status, "error": error, "engine_restarts": restarts,
        "requests_waiting": waiting, "requests_in_flight": in_flight, "engine": engine,
    });
    (code, Json(body)).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let info = st.engine.info();
    let meta =
        info.map(|i| json!({"vocab_size": i.vocab_size, "context_length": i.context_length}));
    Json(json!({"object": "list", "data": [{
        "id": st.model_name(), "object": "model", "created": st.created, "owned_by": "strata", "meta": meta,
    }]}))
    .into_response()
}

/// A validated request, in tokens.
struct Job {
    prompt: Vec<u32>,
    max_tokens: u32,
    sampling: SamplingParams,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let result = async {
        let req: CompletionRequest = parse_body(&body)?;
        let prompt = match req.prompt {
            Prompt::Text(t) => st.tokenize(&t),
            Prompt::Texts(v) if v.len() == 1 => st.tokenize(&v[0]),
            Prompt::Tokens(t) => t,
            Prompt::TokenLists(mut v) if v.len() == 1 => v.remove(0),
            _ => {
                return Err(ApiError::bad_request(
                    "only one prompt per request is supported",
                ));
            }
        };
        let job = make_job(&st, prompt, req.params).await?;
        Ok(run(st.clone(), job, Kind::Completion).await)
    };
    result.await.unwrap_or_else(|e: ApiError| e.into_response())
}

async fn chat_completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let result = async {
        let req: ChatRequest = parse_body(&body)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request("`messages` must not be empty"));
        }
        let mut messages = Vec::with_capacity(req.messages.len());
        for m in req.messages {
            let content = match m.content {
                Some(c) => c.into_text()?,
                None => String::new(),
            };
            messages.push(ChatMessage {
                role: m.role,
                content,
            });
        }
        let text = st
            .tokenizer
            .apply_chat_template(&messages, true)
            .map_err(|e| ApiError::bad_request(format!("chat template: {e}")))?;
        let prompt = st.tokenize(&text);
        let job = make_job(&st, prompt, req.params).await?;
        Ok(run(st.clone(), job, Kind::Chat).await)
    };
    result.await.unwrap_or_else(|e: ApiError| e.into_response())
}

/// Validate parameters and map them onto the protocol's sampling parameters.
async fn make_job(st: &AppState, prompt: Vec<u32>, p: CommonParams) -> Result<Job, ApiError> {
    if p.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported"));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    let vocab = st.tokenizer.vocab_size() as u32;
    if let Some(t) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::bad_request(format!(
            "token id {t} is out of range (vocabulary of {vocab})"
        )));
    }
    let mut s = SamplingParams::default();
    if let Some(t) = p.temperature {
        if !(t.is_finite() && (0.0..=2.0).contains(&t)) {
            return Err(ApiError::bad_request(format!(
                "temperature must be in [0, 2], got {t}"
            )));
        }
        s.temperature = t;
    }
    if let Some(t) = p.top_p {
        if !(t > 0.0 && t <= 1.0) {
            return Err(ApiError::bad_request(format!(
                "top_p must be in (0, 1], got {t}"
            )));
        }
        s.top_p = t;
    }
    if let Some(m) = p.min_p {
        if !(0.0..=1.0).contains(&m) {
            return Err(ApiError::bad_request(format!(
                "min_p must be in [0, 1], got {m}"
            )));
        }
        s.min_p = m;
    }
    if let Some(r) = p.repeat_penalty {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::bad_request(format!(
                "repeat_penalty must be > 0, got {r}"
            )));
        }
        s.repeat_penalty = r;
    }
    s.top_k = p.top_k.unwrap_or(s.top_k);
    s.repeat_last_n = p.repeat_last_n.unwrap_or(s.repeat_last_n);
    s.seed = p.seed.and_then(|v| u64::try_from(v).ok());
    let stops = p.stop.map(|s| s.into_vec()).unwrap_or_default();
    // Context: known once the engine said hello; wait for it so the check is always made.
    let ctx = st
        .engine
        .ready()
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?
        .info
        .context_length;
    let room = ctx.saturating_sub(prompt.len() as u32);
    if room == 0 {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!(
                "prompt of {} tokens does not fit the context of {ctx}",
                prompt.len()
            ))
        });
    }
    let max_tokens = p
        .max_completion_tokens
        .or(p.max_tokens)
        .map_or(room, |m| m.min(room));
    Ok(Job {
        prompt,
        max_tokens,
        sampling: s,
        stops,
        stream: p.stream,
        include_usage: p.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// Outcome of a finished generation.
struct Finish {
    reason: &'static str,
    completion_tokens: u32,
    /// llama.cpp-style `timings`, measured here: submit → first token → end.
    timings: Value,
}

struct Clock {
    start: std::time::Instant,
    first: Option<std::time::Instant>,
}

impl Clock {
    fn timings(&self, prompt_n: usize, predicted_n: u32) -> Value {
        let end = std::time::Instant::now();
        let first = self.first.unwrap_or(end);
        let prompt_ms = (first - self.start).as_secs_f64() * 1e3;
        let predicted_ms = (end - first).as_secs_f64() * 1e3;
        // Tokens after the first, over the time after the first: the decode rate.
        let per_s = |n: f64, ms: f64| if ms > 0.0 { n * 1e3 / ms } else { 0.0 };
        json!({"prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_second": per_s(prompt_n as f64, prompt_ms),
               "predicted_n": predicted_n, "predicted_ms": predicted_ms,
               "predicted_per_second": per_s(predicted_n.saturating_sub(1) as f64, predicted_ms)})
    }
}

async fn start(st: &AppState, job: &Job) -> Result<Generation, ApiError> {
    let req = GenerateRequest {
        id: 0, // assigned by the engine handle
        tokens: job.prompt.clone(),
        max_tokens: job.max_tokens,
        sampling: job.sampling.clone(),
        stop_tokens: if st.eog.is_empty() {
            None
        } else {
            Some(st.eog.clone())
        },
    };
    st.engine
        .submit(req)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))
}

/// Drive one generation, calling `on_text` for every text delta. Ends on the engine's done, a
/// stop string, or an engine failure (Err).
async fn drive(
    st: &AppState,
    mut generation: Generation,
    stops: Vec<String>,
    mut on_text: impl FnMut(String) -> bool,
) -> Result<Finish, ApiError> {
    let tok = st.tokenizer.clone();
    // Control tokens (`<start_of_turn>`, ...) are not text: left out, as llama.cpp's server does.
    let mut detok = Detokenizer::new(
        move |t| {
            if tok.is_control(t) {
                Vec::new()
            } else {
                tok.token_to_bytes(t)
            }
        },
        stops,
    );
    let mut n = 0u32;
    let prompt_n = generation.prompt_len();
    let mut clock = Clock {
        start: std::time::Instant::now(),
        first: None,
    };
    loop {
        match generation.next().await {
            EngineEvent::Token(t) => {
                n += 1;
                clock.first.get_or_insert_with(std::time::Instant::now);
                let step = detok.push(t);
                if !step.emit.is_empty() && !on_text(step.emit) {
                    return Err(ApiError::server("client went away"));
                }
                if step.stopped {
                    // Dropping `generation` cancels it at the engine.
                    return Ok(Finish {
                        reason: "stop",
                        completion_tokens: n,
                        timings: clock.timings(prompt_n, n),
                    });
                }
            }
            EngineEvent::Done(d) => {
                let step = detok.finish();
                if !step.emit.is_empty() {
                    on_text(step.emit);
                }
                let reason = match d.reason {
                    FinishReason::Length if !step.stopped => "length",
                    FinishReason::Error => {
                        return Err(ApiError::server(format!(
                            "engine error: {}",
                            d.error.unwrap_or_default()
                        )));
                    }
                    _ => "stop",
                };
                return Ok(Finish {
                    reason,
                    completion_tokens: n,
                    timings: clock.timings(prompt_n, n),
                });
            }
            EngineEvent::Failed(e) => return Err(ApiError::server(format!("engine failure: {e}"))),
        }
    }
}

async fn run(st: Arc<AppState>, job: Job, kind: Kind) -> Response {
    let generation = match start(&st, &job).await {
        Ok(g) => g,
        Err(e) => return e.into_response(),
    };
    let (id, created, model) = (
        st.next_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        now(),
        st.model_name(),
    );
    let prompt_tokens = job.prompt.len() as u32;
    let usage = move |completion: u32| {
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion,
               "total_tokens": prompt_tokens + completion})
    };
    if !job.stream {
        let mut text = String::new();
        let finish = match drive(&st, generation, job.stops, |t| {
            text.push_str(&t);
            true
        })
        .await
        {
            Ok(f) => f,
            Err(e) => return e.into_response(),
        };
        let choice = match kind {
            Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish.reason, "logprobs": null}),
            Kind::Completion => {
                json!({"index": 0, "text": text, "finish_reason": finish.reason, "logprobs": null})
            }
        };
        let object = if kind == Kind::Chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        return Json(
            json!({"id": id, "object": object, "created": created, "model": model,
                           "choices": [choice], "usage": usage(finish.completion_tokens),
                           "timings": finish.timings}),
        )
        .into_response();
    }

    // Streaming: a task produces SSE events into a channel; a closed channel (client gone) ends
    // the task, which drops the generation and so cancels it at the engine.
    let (tx, rx) = mpsc::unbounded_channel::<Result<Event, Infallible>>();
    let object = if kind == Kind::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let chunk = move |delta: Option<&str>, role: bool, finish: Option<&str>| -> Value {
        let choice = match kind {
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if role {
                    d.insert("role".into(), "assistant".into());
                }
                if let Some(t) = delta {
                    d.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": d, "finish_reason": finish, "logprobs": null})
            }
            Kind::Completion => {
                json!({"index": 0, "text": delta.unwrap_or(""), "finish_reason": finish, "logprobs": null})
            }
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    };
    tokio::spawn(async move {
        let send = |v: Value| Ok(Event::default().data(v.to_string()));
        if kind == Kind::Chat && tx.send(send(chunk(Some(""), true, None))).is_err() {
            return;
        }
        let tx2 = tx.clone();
        let chunk2 = chunk.clone();
        let on_text = move |t: String| tx2.send(send(chunk2(Some(&t), false, None))).is_ok();
        let result = tokio::select! {
            r = drive(&st, generation, job.stops, on_text) => r,
            _ = tx.closed() => return,
        };
        match result {
            Ok(f) => {
                let mut last = chunk(None, false, Some(f.reason));
                last["timings"] = f.timings;
                let _ = tx.send(send(last));
                if job.include_usage {
                    let mut u = chunk(None, false, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(f.completion_tokens);
                    let _ = tx.send(send(u));
                }
                let _ = tx.send(Ok(Event::default().data("[DONE]")));
            }
            // OpenAI clients raise on a data chunk carrying `error`; no [DONE] after it.
            Err(e) => {
                let _ = tx.send(send(e.body()));
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
