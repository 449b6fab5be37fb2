//! One generation, shared by every API: parameters validated into a token job, the job run at
//! the engine (through its queue), token ids turned into text deltas with stop strings cut out
//! and tool calls parsed out, and how it ended. The API modules only translate their request
//! into a [`GenParams`] + prompt and the pieces into their response shape.

use crate::engine_process::{EngineEvent, Generation};
use crate::error::ApiError;
use crate::http::AppState;
use crate::metrics::Outcome;
use crate::protocol::{FinishReason, GenerateRequest, SamplingParams};
use crate::text::Detokenizer;
use crate::tools::{Piece, ToolCallParser};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::future::Future;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Sampling and length settings as the APIs name them; `None` = the server's default.
#[derive(Debug, Default)]
pub struct GenParams {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    /// Upper bound of `temperature` in this API (OpenAI 2, Anthropic 1).
    pub temperature_max: f32,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    /// Negative = random (llama.cpp uses -1).
    pub seed: Option<i64>,
    pub stops: Vec<String>,
}

/// A validated request, in tokens.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
}

/// Validate parameters and map them onto the protocol's sampling parameters.
pub async fn make_job(st: &AppState, prompt: Vec<u32>, p: GenParams) -> Result<Job, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    let vocab = st.tokenizer.vocab_size() as u32;
    if let Some(t) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(ApiError::bad_request(format!("token id {t} is out of range (vocabulary of {vocab})")));
    }
    let mut s = SamplingParams::default();
    if let Some(t) = p.temperature {
        if !(t.is_finite() && t >= 0.0 && t <= p.temperature_max) {
            return Err(ApiError::bad_request(format!("temperature must be in [0, {}], got {t}", p.temperature_max)));
        }
        s.temperature = t;
    }
    if let Some(t) = p.top_p {
        if !(t > 0.0 && t <= 1.0) {
            return Err(ApiError::bad_request(format!("top_p must be in (0, 1], got {t}")));
        }
        s.top_p = t;
    }
    if let Some(m) = p.min_p {
        if !(0.0..=1.0).contains(&m) {
            return Err(ApiError::bad_request(format!("min_p must be in [0, 1], got {m}")));
        }
        s.min_p = m;
    }
    if let Some(r) = p.repeat_penalty {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::bad_request(format!("repeat_penalty must be > 0, got {r}")));
        }
        s.repeat_penalty = r;
    }
    s.top_k = p.top_k.unwrap_or(s.top_k);
    s.repeat_last_n = p.repeat_last_n.unwrap_or(s.repeat_last_n);
    s.seed = p.seed.and_then(|v| u64::try_from(v).ok());
    // Context: known once the engine said hello; wait for it so the check is always made.
    let ctx = st.engine.ready().await.map_err(|e| ApiError::unavailable(e.to_string()))?.info.context_length;
    let room = ctx.saturating_sub(prompt.len() as u32);
    if room == 0 {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!("prompt of {} tokens does not fit the context of {ctx}", prompt.len()))
        });
    }
    Ok(Job { prompt, max_tokens: p.max_tokens.map_or(room, |m| m.min(room)), sampling: s, stops: p.stops })
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// The model's end-of-generation token (or a cancel).
    EndOfGeneration,
    /// One of the request's stop strings (which one).
    StopString(String),
    /// `max_tokens` reached or the context is full.
    Length,
}

/// Outcome of a finished generation.
pub struct Finish {
    pub ending: Ending,
    pub completion_tokens: u32,
    /// Prompt tokens the engine reused from its previous request instead of computing them (its
    /// done line's `prompt_cached_tokens`; 0 when a stop string ended the generation first).
    pub cached_tokens: u32,
    /// llama.cpp-style `timings`, measured here: submit → first token → end.
    pub timings: Value,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn openai_reason(&self) -> &'static str {
        match self.ending {
            Ending::Length => "length",
            _ => "stop",
        }
    }
}

struct Clock {
    start: Instant,
    first: Option<Instant>,
}

impl Clock {
    fn timings(&self, prompt_n: usize, predicted_n: u32) -> Value {
        let end = Instant::now();
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

/// Queue the job at the engine (waits for its turn).
pub async fn start(st: &AppState, job: &Job) -> Result<Generation, ApiError> {
    let req = GenerateRequest {
        id: 0, // assigned by the engine handle
        tokens: job.prompt.clone(),
        max_tokens: job.max_tokens,
        sampling: job.sampling.clone(),
        stop_tokens: if st.eog.is_empty() { None } else { Some(st.eog.clone()) },
    };
    let mut g = st.engine.submit(req).await.map_err(|e| ApiError::unavailable(e.to_string()))?;
    let queue_ms = g.started_us().saturating_sub(g.queued_us()) as f64 / 1e3;
    g.set_recording(st.metrics.sent(g.id(), g.prompt_len(), queue_ms));
    Ok(g)
}

/// Drive one generation, calling `on_text` for every text delta. Ends on the engine's done, a
/// stop string, or an engine failure (Err). `on_text` returning `false` (client gone) ends it
/// too; dropping the generation cancels it at the engine.
pub async fn drive(
    st: &AppState,
    mut generation: Generation,
    stops: Vec<String>,
    mut on_text: impl FnMut(String) -> bool,
) -> Result<Finish, ApiError> {
    let tok = st.tokenizer.clone();
    // Control tokens (`<start_of_turn>`, ...) are not text: left out, as llama.cpp's server does.
    let mut detok = Detokenizer::new(
        move |t| {
            if tok.is_control(t) { Vec::new() } else { tok.token_to_bytes(t) }
        },
        stops,
    );
    let mut n = 0u32;
    let prompt_n = generation.prompt_len();
    let mut clock = Clock { start: Instant::now(), first: None };
    // Records the request for /metrics and /v1/status when this function returns or is dropped.
    let mut rec = generation.take_recording().unwrap_or_else(|| st.metrics.recording(generation.id()));
    let stopped_by = |detok: &Detokenizer| Ending::StopString(detok.matched_stop().unwrap_or_default().to_string());
    loop {
        match generation.next().await {
            EngineEvent::Token(t) => {
                n += 1;
                clock.first.get_or_insert_with(Instant::now);
                rec.token();
                let step = detok.push(t);
                if !step.emit.is_empty() && !on_text(step.emit) {
                    return Err(ApiError::server("client went away"));
                }
                if step.stopped {
                    rec.outcome = Outcome::Finished("stop_sequence");
                    return Ok(Finish {
                        ending: stopped_by(&detok),
                        completion_tokens: n,
                        cached_tokens: 0,
                        timings: clock.timings(prompt_n, n),
                    });
                }
            }
            EngineEvent::Done(d) => {
                rec.stats = d.stats.clone();
                let step = detok.finish();
                if !step.emit.is_empty() {
                    on_text(step.emit);
                }
                let ending = match d.reason {
                    _ if step.stopped => stopped_by(&detok),
                    FinishReason::Length => Ending::Length,
                    FinishReason::Error => {
                        rec.outcome = Outcome::Failed(500);
                        return Err(ApiError::server(format!("engine error: {}", d.error.unwrap_or_default())));
                    }
                    _ => Ending::EndOfGeneration,
                };
                rec.outcome = Outcome::Finished(match ending {
                    Ending::EndOfGeneration => "stop",
                    Ending::StopString(_) => "stop_sequence",
                    Ending::Length => "length",
                });
                let cached_tokens = rec.stats.as_ref().and_then(|s| s.prompt_cached_tokens).unwrap_or(0) as u32;
                return Ok(Finish { ending, completion_tokens: n, cached_tokens, timings: clock.timings(prompt_n, n) });
            }
            EngineEvent::Failed(e) => {
                rec.outcome = Outcome::Failed(500);
                return Err(ApiError::server(format!("engine failure: {e}")));
            }
            EngineEvent::TimedOut(e) => {
                rec.outcome = Outcome::Failed(504);
                return Err(ApiError::timeout(format!("engine timeout: {e}")));
            }
        }
    }
}

/// [`drive`], with the text split into [`Piece`]s: plain text, and tool calls when a parser is
/// given (the model's `<tool_call>` blocks never reach the client as text). `on_piece`
/// returning `false` (client gone) ends the generation.
pub async fn drive_pieces(
    st: &AppState,
    generation: Generation,
    stops: Vec<String>,
    mut parser: Option<ToolCallParser>,
    mut on_piece: impl FnMut(Piece) -> bool,
) -> Result<Finish, ApiError> {
    let on_text = |text: String| match parser.as_mut() {
        None => on_piece(Piece::Text(text)),
        Some(p) => p.push(&text).into_iter().all(&mut on_piece),
    };
    let finish = drive(st, generation, stops, on_text).await?;
    if let Some(p) = parser.as_mut() {
        for piece in p.finish() {
            on_piece(piece);
        }
    }
    Ok(finish)
}

/// A started request's place in the engine queue, sent as response headers so a client (the
/// load test) can check the order of service: `x-strata-request-id` (the protocol id; ids are
/// assigned as requests leave the queue, so with one engine slot they follow the order of
/// service), `x-strata-queued-us` and `x-strata-started-us` (when the request entered the queue
/// and when it was sent to the engine, in µs on one server clock).
#[derive(Clone, Copy, Debug)]
pub struct QueueInfo {
    pub id: u64,
    pub queued_us: u64,
    pub started_us: u64,
}

impl QueueInfo {
    pub fn of(g: &Generation) -> QueueInfo {
        QueueInfo { id: g.id(), queued_us: g.queued_us(), started_us: g.started_us() }
    }

    pub fn apply(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        for (name, v) in [
            ("x-strata-request-id", self.id),
            ("x-strata-queued-us", self.queued_us),
            ("x-strata-started-us", self.started_us),
        ] {
            h.insert(name, v.into());
        }
    }
}

/// Where a streaming handler sends its Server-Sent Events.
pub type EventSink = mpsc::UnboundedSender<Result<Event, Infallible>>;

/// An SSE response whose events `produce` sends. `produce` runs in its own task; when the
/// client goes away the task is dropped mid-way, and with it the generation, which cancels
/// the request at the engine so the queue moves on.
pub fn sse_response<Fut>(produce: impl FnOnce(EventSink) -> Fut) -> Response
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let watch = tx.clone();
    let task = produce(tx);
    tokio::spawn(async move {
        tokio::select! {
            _ = task => {}
            _ = watch.closed() => {}
        }
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}
