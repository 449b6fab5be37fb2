//! One request of the load test: what to send ([`Spec`]) and what happened ([`Outcome`]).

use super::client::*;
use serde::Serialize;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
    /// `/v1/messages`
    Messages,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completion => "/v1/completions",
            Api::Messages => "/v1/messages",
        }
    }
}

/// What to send.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    pub api: Api,
    pub stream: bool,
    /// Hang up after the first text delta (streaming only).
    pub cancel: bool,
    pub max_tokens: u32,
    pub prompt: String,
    pub seed: u64,
}

impl Spec {
    pub fn body(&self) -> Value {
        let messages = json!([{"role": "user", "content": self.prompt}]);
        let mut b = match self.api {
            Api::Chat => json!({"messages": messages}),
            Api::Completion => json!({"prompt": self.prompt}),
            Api::Messages => json!({"messages": messages}),
        };
        b["max_tokens"] = self.max_tokens.into();
        b["stream"] = self.stream.into();
        b["temperature"] = json!(0.7);
        b["seed"] = self.seed.into();
        if self.stream && self.api != Api::Messages {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    }
}

/// What happened. Times are in ms since the load test's start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    pub client: usize,
    pub seq: usize,
    pub api: Option<Api>,
    pub stream: bool,
    pub cancel: bool,
    pub sent_ms: f64,
    pub head_ms: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub end_ms: f64,
    pub status: u16,
    /// Completed as the API promises (or hung up by us after its first token, `cancel`).
    pub ok: bool,
    /// We hung up after the first token as planned.
    pub cancelled: bool,
    pub error: Option<String>,
    /// From `usage` when the answer completed; text deltas received when cancelled.
    pub tokens: u32,
    pub text_deltas: u32,
    /// `x-strata-request-id`, `x-strata-queued-us`, `x-strata-started-us`.
    pub queue: Option<(u64, u64, u64)>,
    /// `timings.predicted_per_second` (OpenAI endpoints).
    pub decode_tps: Option<f64>,
    /// The error event or body, when the answer was an error.
    pub error_body: Option<Value>,
}

pub(super) fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// Send `spec` and follow its answer to the end (or to the planned hang-up).
pub async fn run_one(addr: SocketAddr, spec: &Spec, t0: Instant) -> Outcome {
    run_one_notify(addr, spec, t0, None).await
}

/// [`run_one`], telling `first` when the first text delta arrives (fault tests inject their
/// fault mid-stream).
pub async fn run_one_notify(
    addr: SocketAddr,
    spec: &Spec,
    t0: Instant,
    first: Option<tokio::sync::oneshot::Sender<()>>,
) -> Outcome {
    let mut o = Outcome {
        api: Some(spec.api),
        stream: spec.stream,
        cancel: spec.cancel,
        sent_ms: ms(t0),
        ..Default::default()
    };
    let body = spec.body().to_string();
    let res = follow(addr, spec, &body, t0, &mut o, first).await;
    o.end_ms = ms(t0);
    if let Err(e) = res {
        o.ok = false;
        o.error = Some(e);
    }
    o
}

async fn follow(
    addr: SocketAddr,
    spec: &Spec,
    body: &str,
    t0: Instant,
    o: &mut Outcome,
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), String> {
    let (head, mut b) = send(addr, "POST", spec.api.path(), Some(body)).await.map_err(|e| format!("request: {e}"))?;
    o.head_ms = Some(ms(t0));
    o.status = head.status;
    if let (Some(id), Some(q), Some(s)) = (
        head.header_u64("x-strata-request-id"),
        head.header_u64("x-strata-queued-us"),
        head.header_u64("x-strata-started-us"),
    ) {
        o.queue = Some((id, q, s));
    }
    let sse = head.header("content-type").is_some_and(|c| c.starts_with("text/event-stream"));
    if head.status != 200 || !sse {
        let bytes = b.read_all().await.map_err(|e| format!("body: {e}"))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("status {} body not JSON ({e}): {}", head.status, String::from_utf8_lossy(&bytes)))?;
        if head.status != 200 {
            o.error_body = Some(v.clone());
            return Err(format!("status {}: {v}", head.status));
        }
        if spec.stream {
            return Err(format!("asked to stream, got JSON: {v}"));
        }
        o.first_token_ms = Some(ms(t0));
        let usage = &v["usage"];
        o.tokens = usage["completion_tokens"]
            .as_u64()
            .or(usage["output_tokens"].as_u64())
            .ok_or_else(|| format!("no usage in {v}"))? as u32;
        o.decode_tps = v["timings"]["predicted_per_second"].as_f64();
        o.ok = true;
        return Ok(());
    }
    let mut parser = SseParser::default();
    let mut finished = false;
    loop {
        let piece = match b.next().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => return Err(format!("stream: {e}")),
        };
        for (name, data) in parser.push(&piece) {
            if finished {
                return Err(format!("data after the end of the stream: {data}"));
            }
            let mut text = false;
            if spec.api == Api::Messages {
                let v: Value = serde_json::from_str(&data).map_err(|e| format!("event data not JSON ({e}): {data}"))?;
                match name.as_deref().unwrap_or("") {
                    "content_block_delta" => text = true,
                    "message_delta" => o.tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0) as u32,
                    "message_stop" => finished = true,
                    "error" => {
                        o.error_body = Some(v.clone());
                        return Err(format!("error event: {v}"));
                    }
                    _ => {}
                }
            } else if data == "[DONE]" {
                finished = true;
            } else {
                let v: Value = serde_json::from_str(&data).map_err(|e| format!("chunk not JSON ({e}): {data}"))?;
                if v.get("error").is_some() {
                    o.error_body = Some(v.clone());
                    return Err(format!("error chunk: {v}"));
                }
                let c = &v["choices"][0];
                let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
                text = piece.is_some_and(|p| !p.is_empty());
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    o.tokens = n as u32;
                }
                if let Some(t) = v["timings"]["predicted_per_second"].as_f64() {
                    o.decode_tps = Some(t);
                }
            }
            if text {
                o.text_deltas += 1;
                o.first_token_ms.get_or_insert_with(|| ms(t0));
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
                if spec.cancel {
                    // Hang up mid-stream: the connection is dropped with `b`.
                    o.cancelled = true;
                    o.ok = true;
                    o.tokens = o.text_deltas;
                    return Ok(());
                }
            }
        }
    }
    if !finished {
        return Err("stream ended without its final event".into());
    }
    o.ok = true;
    Ok(())
}
