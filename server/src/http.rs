//! The HTTP server: state, routes, `/health` and `/v1/models`. The APIs are in `openai` and
//! `anthropic`; both run their requests through `generate` (one pipeline: job → engine queue →
//! text with stop strings and tool calls applied → response or stream).
//!
//! The server tokenizes prompts and detokenizes output itself (tokenizer from a GGUF file); the
//! engine process only sees token ids (see `protocol`). Stop strings are applied here, on the
//! detokenized text, and never sent to the client.

use crate::config::{ApiKey, Resolved, ServerConfig, exposure_warning};
use crate::engine_process::{EngineHandle, EngineStatus};
use crate::error::{Anthropic, ApiError};
use crate::metrics::Metrics;
use crate::{anthropic, openai, status, web};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokenizer::Tokenizer;

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
    /// `/metrics` and the live parts of `/v1/status`.
    pub metrics: Arc<Metrics>,
    /// The tokenizer GGUF's `general.architecture` (normally the model's), for `/v1/status`.
    pub arch: Option<String>,
}

/// Load the tokenizer, start the engine and serve until Ctrl-C.
pub async fn run_server(cfg: ServerConfig) -> anyhow::Result<()> {
    let resolved = cfg.resolve()?;
    let limits = cfg.conn_limits()?;
    let api_key = cfg.api_key()?;
    let listener = tokio::net::TcpListener::bind((resolved.host.as_str(), resolved.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", resolved.host, resolved.port))?;
    let state = build_state(&resolved)?;
    if let Some(w) = exposure_warning(&resolved.host, api_key.is_some()) {
        log_line!("{w}");
    }
    // The line tests and scripts wait for; keep its shape.
    log_line!("strata server: listening on http://{}", listener.local_addr()?);
    crate::serve::serve(listener, router_with_key(state, api_key), limits, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
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
    let arch = gguf.get_str("general.architecture").ok().map(str::to_string);
    let engine = EngineHandle::spawn(
        cfg.executable.clone(),
        cfg.args.clone(),
        cfg.process.clone(),
        cfg.startup_timeout,
        cfg.engine_timeout,
    );
    Ok(Arc::new(AppState {
        metrics: Arc::new(Metrics::new(engine.clone())),
        engine,
        tokenizer: Arc::new(tokenizer),
        eog,
        model_name: cfg.model_name.clone(),
        created: now(),
        counter: AtomicU64::new(0),
        arch,
    }))
}

/// The routes, with request metrics, without an API key ([`router_with_key`] with `None`).
pub fn router(state: Arc<AppState>) -> Router {
    router_with_key(state, None)
}

fn routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status::status))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .merge(web::routes())
        .with_state(state)
}

/// The routes behind an API key (`None`: no check): every request but `/health` and the web
/// UI's assets ([`web::ASSETS`]: pages, scripts, styles, no data) (`/metrics`
/// and `/v1/status` included, as llama-server keeps its `/metrics`) must carry it as
/// `Authorization: Bearer KEY` or `x-api-key: KEY`, else it gets a 401 in the shape of the API
/// it called (Anthropic's under `/v1/messages`, OpenAI's elsewhere). Outermost, every answer
/// (401s too) is counted for `/metrics`.
pub fn router_with_key(state: Arc<AppState>, key: Option<ApiKey>) -> Router {
    let metrics = state.metrics.clone();
    let router = routes(state);
    let router = match key {
        None => router,
        Some(key) => router.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            let key = key.clone();
            async move {
                // The web UI's assets hold no data; its pages send the key themselves.
                if req.uri().path() == "/health" || web::is_asset(req.uri().path()) {
                    return next.run(req).await;
                }
                match check_key(&key, req.headers()) {
                    Ok(()) => next.run(req).await,
                    Err(e) => {
                        let anthropic = req.uri().path().starts_with("/v1/messages");
                        let mut r = if anthropic { Anthropic(e).into_response() } else { e.into_response() };
                        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
                        r
                    }
                }
            }
        })),
    };
    router
        .layer(axum::middleware::from_fn(limit_headers))
        .layer(axum::middleware::from_fn_with_state(metrics, crate::metrics::track))
}

/// Most header bytes (names and values) a request may carry. hyper itself refuses more than
/// 100 headers (431, no body) and a head over ~400 KB; this refuses one huge header early.
pub const MAX_HEADER_BYTES: usize = 32 << 10;

/// 431 in the API's shape for a request whose headers exceed [`MAX_HEADER_BYTES`].
async fn limit_headers(req: Request, next: Next) -> Response {
    let size: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    if size <= MAX_HEADER_BYTES {
        return next.run(req).await;
    }
    let e = ApiError {
        status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        message: format!("request headers of {size} bytes exceed the limit of {MAX_HEADER_BYTES} bytes"),
        kind: "invalid_request_error",
        code: None,
    };
    if req.uri().path().starts_with("/v1/messages") { Anthropic(e).into_response() } else { e.into_response() }
}

/// `Ok` if `Authorization: Bearer` or `x-api-key` holds the key (either one suffices).
fn check_key(key: &ApiKey, headers: &HeaderMap) -> Result<(), ApiError> {
    let bearer = headers.get_all(header::AUTHORIZATION).iter().filter_map(|v| {
        let v = v.as_bytes();
        (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
    });
    let x_api_key = headers.get_all("x-api-key").iter().map(|v| v.as_bytes().trim_ascii());
    let mut given = bearer.chain(x_api_key).peekable();
    if given.peek().is_none() {
        return Err(ApiError::unauthorized(
            "missing API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        ));
    }
    // Every candidate is compared (no short cut), each in constant time.
    let ok = given.fold(false, |ok, g| key.matches(g) | ok);
    if ok { Ok(()) } else { Err(ApiError::unauthorized("invalid API key")) }
}

/// Seconds since the Unix epoch (the APIs' `created`).
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl AppState {
    /// The name clients see: `--model-name`, else the engine's.
    pub fn model_name(&self) -> String {
        if let Some(n) = &self.model_name {
            return n.clone();
        }
        self.engine.info().map(|i| i.name).filter(|n| !n.is_empty()).unwrap_or_else(|| "strata".into())
    }

    /// A unique id for a response or a tool call: `prefix-<start time>-<counter>`.
    pub fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}-{}", self.created, self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// Tokenize with specials parsed; BOS prepended once if the model wants one (chat templates
    /// often already start with it).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
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
        // Not started again (engine_process::GIVE_UP_AFTER): only a restart of the server helps.
        EngineStatus::Down { error, gave_up: true, .. } => (StatusCode::SERVICE_UNAVAILABLE, "failed", Some(error)),
        EngineStatus::Down { error, .. } => (StatusCode::SERVICE_UNAVAILABLE, "restarting", Some(error)),
    };
    let engine = st.engine.info().and_then(|i| i.engine);
    let body = json!({
        "status": status, "error": error, "engine_restarts": restarts,
        "requests_waiting": waiting, "requests_in_flight": in_flight, "engine": engine,
        "engine_pid": st.engine.engine_pid(),
        "engine_start_failures": st.engine.start_failures(),
    });
    (code, Json(body)).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let info = st.engine.info();
    let meta = info.map(|i| json!({"vocab_size": i.vocab_size, "context_length": i.context_length}));
    let name = st.model_name();
    // OpenAI's list shape plus the fields of Anthropic's (`type`, `display_name`, `has_more`,
    // `first_id`, `last_id`), so both clients' `models.list()` read it.
    Json(json!({"object": "list", "data": [{
        "id": name, "object": "model", "created": st.created, "owned_by": "strata", "meta": meta,
        "type": "model", "display_name": name,
    }], "has_more": false, "first_id": name, "last_id": name}))
    .into_response()
}

/// `GET /metrics`: Prometheus text format 0.0.4.
async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], st.metrics.render()).into_response()
}
