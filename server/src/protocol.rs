//! The `strata --serve` token protocol: line-delimited JSON between a host (the HTTP server)
//! and an engine process. See `docs/serve-protocol.md` for the normative description.
//!
//! Everything here is plain serde types plus [`serve_loop`], the engine side of the protocol.
//! An engine implements [`TokenEngine`] (model info + "generate tokens for this prompt"), and
//! `serve_loop` does the rest: the hello line, parsing, validation, `max_tokens`, stop tokens,
//! cancellation, and turning every malformed line into an error reply instead of a crash.
//!
//! Requests are processed one at a time, in the order they arrive (the engine is single-sequence).
//! Input is read on a separate thread while a request runs, so a `cancel` for the running request
//! takes effect at the next token.

use serde::{Deserialize, Serialize};
use std::collections::{HashSet, VecDeque};
use std::io::{self, BufRead, Write};
use std::sync::mpsc;
use std::time::Instant;

/// Version of this protocol, sent in the hello line. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// What the engine says about its model, in the hello line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Model name (e.g. `general.name` of the GGUF).
    pub name: String,
    /// Number of token ids the model can produce; valid ids are `0..vocab_size`.
    pub vocab_size: u32,
    /// Maximum sequence length (prompt + generated tokens) the engine accepts.
    pub context_length: u32,
    /// End-of-generation tokens; used as `stop_tokens` when a request does not give any.
    #[serde(default)]
    pub eog_tokens: Vec<u32>,
    /// How many requests the engine runs at once. `serve_loop` engines are single-sequence: 1.
    #[serde(default = "one")]
    pub parallel: u32,
    /// The settings the engine runs with (free-form JSON: backend, KV type, context, threads,
    /// ...), shown by the HTTP server's `/health` so a client can see what it talks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<serde_json::Value>,
}

fn one() -> u32 {
    1
}

/// Sampling parameters. Every field has a default (llama.cpp's), so `{}` is valid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = disabled.
    pub top_k: u32,
    /// Nucleus sampling; 1.0 = disabled.
    pub top_p: f32,
    /// Drop tokens with p < min_p * p(max); 0.0 = disabled.
    pub min_p: f32,
    /// Penalty for tokens among the last `repeat_last_n`; 1.0 = disabled.
    pub repeat_penalty: f32,
    /// Window of the repeat penalty, in tokens (prompt included).
    pub repeat_last_n: u32,
    /// RNG seed; `None` = engine picks one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: None,
        }
    }
}

/// One generation request: complete prompt as token ids (BOS included if the model wants one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Chosen by the host, echoed in every reply. Unique among the requests of one connection.
    pub id: u64,
    pub tokens: Vec<u32>,
    /// Upper bound on generated tokens (the stop token is not counted).
    pub max_tokens: u32,
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Generation ends (reason `stop`) when one of these is sampled; it is not emitted.
    /// Absent = the model's `eog_tokens`. An empty list disables stop tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_tokens: Option<Vec<u32>>,
}

/// Host → engine lines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    Generate(GenerateRequest),
    /// Stop request `id` (running or queued). Unknown/finished ids are ignored.
    Cancel {
        id: u64,
    },
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// A `cancel` arrived.
    Cancelled,
    /// The request was invalid or the engine failed; see `error`.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// Final line of a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub id: u64,
    /// Always `true`; lets a reader spot the final line without looking at `type`.
    pub done: bool,
    pub reason: FinishReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// Milliseconds from reading the request to its first generated token (prompt processing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ms: Option<f64>,
    /// Milliseconds from reading the request to this line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<f64>,
    /// Counters the engine measured for this request, if it measures any
    /// ([`TokenEngine::request_stats`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<RequestStats>,
}

/// Counters an engine may report for one request in its `done` line; each is optional (absent:
/// the engine does not measure it). The HTTP server sums them into `/metrics` and shows them in
/// `/v1/status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestStats {
    /// Prompt tokens the engine did not compute: the prefix its session already held from an
    /// earlier request (prompt reuse). OpenAI's `prompt_tokens_details.cached_tokens`,
    /// Anthropic's `cache_read_input_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cached_tokens: Option<u64>,
    /// Expert-cache lookups (MoE models with an expert cache) that found the expert resident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cache_hits: Option<u64>,
    /// Expert-cache lookups in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cache_lookups: Option<u64>,
    /// Bytes copied into VRAM for the expert cache (admissions, swaps, experts streamed to
    /// the staging ring: what crosses PCIe on a card).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes_to_vram: Option<u64>,
    /// Bytes of missed experts the device read in place from RAM over PCIe (`--pcie-frac`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes_read_over_pcie: Option<u64>,
    /// Microseconds the expert cache's CPU pool spent on experts without a VRAM slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cpu_us: Option<u64>,
    /// Microseconds the per-layer handoff's host thread waited for the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_handoff_wait_us: Option<u64>,
    /// Speculative decoding: draft tokens the model accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_accepted: Option<u64>,
    /// Speculative decoding: draft tokens offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_offered: Option<u64>,
}

/// Engine → host lines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EngineMessage {
    /// First line, once the model is loaded.
    Hello {
        protocol: u32,
        model: ModelInfo,
    },
    /// One generated token.
    Token {
        id: u64,
        token: u32,
    },
    Done(Done),
    /// A line that could not be attributed to any request (not JSON, no `id`).
    Error {
        error: String,
    },
}

/// What an engine implements to be driven by [`serve_loop`].
pub trait TokenEngine {
    fn info(&self) -> ModelInfo;
    /// Process `req.tokens` and sample until `emit` returns `false` (stop token, `max_tokens`,
    /// cancel: all decided by the caller) or the engine cannot go on (context full: return
    /// `Ok(FinishReason::Length)`). `Err` ends the request with reason `error`; the engine must
    /// stay usable for the next request. Stop tokens are passed to `emit` like any other token.
    fn generate(&mut self, req: &GenerateRequest, emit: &mut dyn FnMut(u32) -> bool) -> Result<FinishReason, String>;

    /// Counters of the request `generate` just ran (sent in its `done` line), if the engine
    /// measures any. Default: none.
    fn request_stats(&mut self) -> Option<RequestStats> {
        None
    }
}

/// One parsed host message, or why it is malformed with the request id if one could be read.
pub type Parsed = Result<HostMessage, (Option<u64>, String)>;

/// Parse one host line; on failure returns the id (if one could be read) and the message. A
/// type error names the field (`field `max_tokens`: invalid value: integer `-5`, expected u32`).
pub fn parse_host_line(line: &str) -> Parsed {
    match serde_json::from_str::<HostMessage>(line) {
        Ok(m) => Ok(m),
        Err(e) => match serde_json::from_str::<serde_json::Value>(line) {
            // Valid JSON of the wrong shape: say which field, and salvage the id so the host
            // can fail the right request instead of waiting forever.
            Ok(v) => parse_value(v),
            // Not JSON: an id that can still be read gets the error all the same.
            Err(_) => Err((crate::line_ids::scan_ids(line).last().copied(), not_json(line, &e))),
        },
    }
}

/// Why a line is no JSON value; a leading byte order mark is named (serde_json only says
/// "expected value at column 1").
fn not_json(text: &str, e: &serde_json::Error) -> String {
    if text.trim_start_matches([' ', '\t']).starts_with('\u{feff}') {
        "malformed request: the line starts with a UTF-8 byte order mark (U+FEFF); send JSON \
         without one"
            .to_string()
    } else {
        format!("malformed request: {e}")
    }
}

/// Parse one line as `serve_loop` reads it (bytes, without the `\n`): one entry per request it
/// names. A blank line gives none. A line that is not UTF-8, or that holds more than one JSON
/// value, is malformed: every value on it with a readable `id` gets an error for that id (so
/// the host fails those requests instead of waiting), and a line with no readable id one
/// unattributed error.
pub fn parse_host_bytes(line: &[u8]) -> Vec<Parsed> {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            let at = e.valid_up_to();
            let why =
                format!("malformed request: the line is not valid UTF-8 (byte 0x{:02x} at offset {at})", line[at]);
            let lossy = String::from_utf8_lossy(line);
            let (values, _, rest) = json_values(&lossy);
            return attribute(&values, &lossy[rest..], why);
        }
    };
    if text.trim().is_empty() {
        return Vec::new();
    }
    let (mut values, err, rest) = json_values(text);
    match (values.len(), err) {
        (0, Some((e, _))) => attribute(&[], text, not_json(text, &e)),
        (1, None) => vec![parse_value(values.pop().expect("one value"))],
        (n, err) => {
            let why = match err {
                None => {
                    format!("malformed request: {n} JSON values on one line (one request per line)")
                }
                Some((_, col)) => format!(
                    "malformed request: unexpected characters after {} at column {col} (one request per line)",
                    if n == 1 { "the JSON value".to_string() } else { format!("{n} JSON values") }
                ),
            };
            attribute(&values, &text[rest..], why)
        }
    }
}

/// The JSON values at the start of `text`, the error (with its column) where the rest is not
/// a JSON value, and the byte offset where the values end.
type Values = (Vec<serde_json::Value>, Option<(serde_json::Error, usize)>, usize);

fn json_values(text: &str) -> Values {
    let mut values = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    loop {
        let end = stream.byte_offset();
        match stream.next() {
            Some(Ok(v)) => values.push(v),
            Some(Err(e)) => {
                let col = e.column();
                return (values, Some((e, col)), end);
            }
            None => return (values, None, end),
        }
    }
}

/// The same error for every readable id (of the parsed `values`, then of the unparsable
/// `rest`); one unattributed error if there is none.
fn attribute(values: &[serde_json::Value], rest: &str, why: String) -> Vec<Parsed> {
    let ids: Vec<u64> =
        values.iter().filter_map(|v| v.get("id")?.as_u64()).chain(crate::line_ids::scan_ids(rest)).collect();
    if ids.is_empty() {
        return vec![Err((None, why))];
    }
    ids.into_iter().map(|id| Err((Some(id), why.clone()))).collect()
}

/// A host message from one JSON value; a type error names the field it is about.
fn parse_value(v: serde_json::Value) -> Parsed {
    let e = match HostMessage::deserialize(&v) {
        Ok(m) => return Ok(m),
        Err(e) => e,
    };
    let id = v.get("id").and_then(|i| i.as_u64());
    // The tagged enum reports no path; the variant's struct, deserialized on its own, does.
    let field = match v.get("type").and_then(|t| t.as_str()) {
        Some("generate") => field_error::<GenerateRequest>(&v),
        Some("cancel") => field_error::<CancelFields>(&v),
        _ => None,
    };
    let why = match field {
        Some((path, inner)) if path != "." => format!("field `{path}`: {inner}"),
        _ => e.to_string(),
    };
    Err((id, format!("malformed request: {why}")))
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct CancelFields {
    id: u64,
}

fn field_error<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Option<(String, String)> {
    match serde_path_to_error::deserialize::<_, T>(v) {
        Ok(_) => None,
        Err(e) => Some((e.path().to_string(), e.inner().to_string())),
    }
}

/// Serialize one message as a line (no trailing newline).
pub fn to_line<T: Serialize>(msg: &T) -> String {
    // Serializing these plain structs cannot fail (no maps with non-string keys, no floats
    // that serde_json rejects: NaN becomes null).
    serde_json::to_string(msg).unwrap_or_else(|e| format!(r#"{{"type":"error","error":"{e}"}}"#))
}

fn write_msg(out: &mut impl Write, msg: &EngineMessage) -> io::Result<()> {
    out.write_all(to_line(msg).as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Input as seen by the main loop: a line (bytes, without its `\n` or `\r\n`), or the end.
enum Input {
    Line(Vec<u8>),
    Eof,
}

/// Run the engine side of the protocol until `input` ends. Writes the hello line first.
/// Returns `Err` only for I/O errors on `output` (e.g. the host went away) or `input`.
pub fn serve_loop<E: TokenEngine>(
    engine: &mut E,
    input: impl BufRead + Send,
    mut output: impl Write,
) -> io::Result<()> {
    let info = engine.info();
    write_msg(&mut output, &EngineMessage::Hello { protocol: PROTOCOL_VERSION, model: info.clone() })?;

    let (tx, rx) = mpsc::channel::<io::Result<Input>>();
    std::thread::scope(|scope| {
        // Reader thread: lets a `cancel` reach us while `generate` is running.
        // Lines are split as bytes, so a line that is not UTF-8 is one malformed request
        // (`parse_host_bytes`), not the end of the input.
        scope.spawn(move || {
            let mut input = input;
            loop {
                let mut line = Vec::new();
                match input.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                            if line.last() == Some(&b'\r') {
                                line.pop();
                            }
                        }
                        if tx.send(Ok(Input::Line(line))).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
            let _ = tx.send(Ok(Input::Eof));
        });
        let mut state = LoopState { queue: VecDeque::new(), cancelled: HashSet::new(), eof: false };
        loop {
            // Drain without blocking, then block only if nothing is queued.
            while let Ok(msg) = rx.try_recv() {
                state.accept(msg?, &mut output)?;
            }
            if let Some(req) = state.queue.pop_front() {
                run_one(engine, &info, req, &rx, &mut state, &mut output)?;
                continue;
            }
            if state.eof {
                return Ok(());
            }
            match rx.recv() {
                Ok(msg) => state.accept(msg?, &mut output)?,
                Err(_) => return Ok(()),
            }
        }
    })
}

struct LoopState {
    queue: VecDeque<GenerateRequest>,
    /// Cancels for requests that have not started yet (or that may still arrive: a cancel can
    /// overtake nothing here, since lines are ordered, so this only holds queued ids).
    cancelled: HashSet<u64>,
    eof: bool,
}

impl LoopState {
    fn accept(&mut self, input: Input, out: &mut impl Write) -> io::Result<()> {
        let line = match input {
            Input::Eof => {
                self.eof = true;
                return Ok(());
            }
            Input::Line(l) => l,
        };
        for parsed in parse_host_bytes(&line) {
            self.handle(parsed, out)?;
        }
        Ok(())
    }

    fn handle(&mut self, parsed: Parsed, out: &mut impl Write) -> io::Result<()> {
        match parsed {
            Ok(HostMessage::Generate(r)) => self.queue.push_back(r),
            Ok(HostMessage::Cancel { id }) => {
                if self.queue.iter().any(|r| r.id == id) {
                    self.cancelled.insert(id);
                }
            }
            Err((Some(id), error)) => write_msg(out, &error_done(id, error, 0))?,
            Err((None, error)) => write_msg(out, &EngineMessage::Error { error })?,
        }
        Ok(())
    }
}

fn error_done(id: u64, error: String, prompt_tokens: u32) -> EngineMessage {
    EngineMessage::Done(Done {
        id,
        done: true,
        reason: FinishReason::Error,
        error: Some(error),
        prompt_tokens,
        generated_tokens: 0,
        prompt_ms: None,
        total_ms: None,
        stats: None,
    })
}

/// Checks done before the engine sees a request, so every engine gets the same validation.
fn validate(req: &GenerateRequest, info: &ModelInfo) -> Result<(), String> {
    if req.tokens.is_empty() {
        return Err("empty prompt: `tokens` must hold at least one token".into());
    }
    if let Some((i, t)) = req.tokens.iter().enumerate().find(|(_, t)| **t >= info.vocab_size) {
        return Err(format!("token {t} at position {i} is out of range (vocab_size {})", info.vocab_size));
    }
    if req.tokens.len() >= info.context_length as usize {
        return Err(format!(
            "prompt of {} tokens does not fit the context of {} tokens",
            req.tokens.len(),
            info.context_length
        ));
    }
    let s = &req.sampling;
    if !(s.temperature.is_finite() && s.temperature >= 0.0) {
        return Err(format!("sampling.temperature must be >= 0, got {}", s.temperature));
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return Err(format!("sampling.top_p must be in (0, 1], got {}", s.top_p));
    }
    if !(s.min_p >= 0.0 && s.min_p <= 1.0) {
        return Err(format!("sampling.min_p must be in [0, 1], got {}", s.min_p));
    }
    if !(s.repeat_penalty.is_finite() && s.repeat_penalty > 0.0) {
        return Err(format!("sampling.repeat_penalty must be > 0, got {}", s.repeat_penalty));
    }
    Ok(())
}

fn run_one<E: TokenEngine>(
    engine: &mut E,
    info: &ModelInfo,
    req: GenerateRequest,
    rx: &mpsc::Receiver<io::Result<Input>>,
    state: &mut LoopState,
    out: &mut impl Write,
) -> io::Result<()> {
    let start = Instant::now();
    let prompt_tokens = req.tokens.len() as u32;
    if state.cancelled.remove(&req.id) {
        return write_msg(out, &done(req.id, FinishReason::Cancelled, None, prompt_tokens, 0, None, start));
    }
    if let Err(e) = validate(&req, info) {
        return write_msg(out, &error_done(req.id, e, prompt_tokens));
    }
    let stop: HashSet<u32> = req.stop_tokens.as_ref().unwrap_or(&info.eog_tokens).iter().copied().collect();
    let mut generated = 0u32;
    let mut first_token: Option<f64> = None;
    // Why the loop (not the engine) ended the request; `None` = the engine stopped on its own.
    let mut ended: Option<FinishReason> = None;
    let mut io_err: Option<io::Error> = None;
    let mut emit = |token: u32| -> bool {
        if first_token.is_none() {
            first_token = Some(ms(start));
        }
        // Reading input mid-generation is the only way a cancel can arrive in time.
        while let Ok(msg) = rx.try_recv() {
            let r = msg.and_then(|m| state.accept_during(req.id, m, out, &mut ended));
            if let Err(e) = r {
                io_err = Some(e);
                return false;
            }
        }
        if ended.is_some() {
            return false;
        }
        if stop.contains(&token) {
            ended = Some(FinishReason::Stop);
            return false;
        }
        if let Err(e) = write_msg(out, &EngineMessage::Token { id: req.id, token }) {
            io_err = Some(e);
            return false;
        }
        generated += 1;
        if generated >= req.max_tokens {
            ended = Some(FinishReason::Length);
            return false;
        }
        true
    };
    let result = if req.max_tokens == 0 { Ok(FinishReason::Length) } else { engine.generate(&req, &mut emit) };
    if let Some(e) = io_err {
        return Err(e);
    }
    let mut msg = match (ended, result) {
        (Some(reason), _) => done(req.id, reason, None, prompt_tokens, generated, first_token, start),
        (None, Ok(reason)) => done(req.id, reason, None, prompt_tokens, generated, first_token, start),
        (None, Err(e)) => done(req.id, FinishReason::Error, Some(e), prompt_tokens, generated, first_token, start),
    };
    if let EngineMessage::Done(d) = &mut msg {
        d.stats = engine.request_stats();
    }
    write_msg(out, &msg)
}

impl LoopState {
    /// Like `accept`, while request `running` is generating: a cancel for it ends it.
    fn accept_during(
        &mut self,
        running: u64,
        input: Input,
        out: &mut impl Write,
        ended: &mut Option<FinishReason>,
    ) -> io::Result<()> {
        let line = match input {
            Input::Line(l) => l,
            eof => return self.accept(eof, out),
        };
        for parsed in parse_host_bytes(&line) {
            match parsed {
                Ok(HostMessage::Cancel { id }) if id == running => {
                    ended.get_or_insert(FinishReason::Cancelled);
                }
                other => self.handle(other, out)?,
            }
        }
        Ok(())
    }
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

fn done(
    id: u64,
    reason: FinishReason,
    error: Option<String>,
    prompt_tokens: u32,
    generated_tokens: u32,
    prompt_ms: Option<f64>,
    start: Instant,
) -> EngineMessage {
    EngineMessage::Done(Done {
        id,
        done: true,
        reason,
        error,
        prompt_tokens,
        generated_tokens,
        prompt_ms,
        total_ms: Some(ms(start)),
        stats: None,
    })
}
