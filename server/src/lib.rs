//! `server`: the `strata --serve` token protocol and the OpenAI-compatible HTTP server.
//!
//! - [`protocol`]: serde types of the line-delimited JSON token protocol and [`protocol::serve_loop`],
//!   the engine side (an engine implements [`protocol::TokenEngine`]).
//! - [`http`]: the axum server ([`run_server`]) that starts an engine process with `--serve`,
//!   tokenizes/detokenizes, and serves OpenAI's `/v1/completions` and `/v1/chat/completions`
//!   ([`openai`]) and Anthropic's `/v1/messages` ([`anthropic`]), both through one pipeline
//!   ([`generate`]; conversations and tools: [`chat`], [`tools`]).
//!
//! - [`web`]: the chat page (`/`) and the Monitor (`/monitor`), embedded HTML/CSS/JS.
//!
//! Docs: `docs/serve-protocol.md`, `docs/server.md`; load and fault tests:
//! `docs/reliability.md` ([`load`] is their HTTP client and load generator).

/// `eprintln!` that never panics: a log line that cannot be written (stderr closed, or a full
/// disk behind it) is dropped and the server keeps serving.
macro_rules! log_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod anthropic;
pub mod chat;
pub mod config;
pub mod engine_process;
pub mod engine_stderr;
pub mod error;
pub mod generate;
pub mod http;
mod line_ids;
pub mod load;
pub mod metrics;
pub mod net;
pub mod openai;
pub mod protocol;
pub mod serve;
pub mod status;
pub mod text;
pub mod tools;
pub mod web;

pub use config::{EngineCommand, ServerConfig};
pub use http::{run_server, run_server_blocking};
pub use protocol::{FinishReason, GenerateRequest, ModelInfo, SamplingParams, TokenEngine, serve_loop};
