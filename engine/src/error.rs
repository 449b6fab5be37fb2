//! Engine errors: one enum, each variant naming what it was about (file, key, tensor, shape).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{source}")]
    Gguf { path: PathBuf, source: gguf::GgufError },
    #[error("{path}: tokenizer: {source}")]
    Tokenizer { path: PathBuf, source: tokenizer::TokenizerError },
    #[error("unsupported architecture '{0}' (supported: gemma3, llama, qwen2, qwen3, qwen3moe)")]
    UnsupportedArch(String),
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}': expected shape {expected:?}, found {found:?}")]
    TensorShape { name: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor '{name}': type {ty} is not supported here ({why})")]
    TensorType { name: String, ty: &'static str, why: &'static str },
    #[error("metadata '{key}': {why}")]
    BadMetadata { key: String, why: String },
    #[error(
        "request needs {needed} positions but the context holds {capacity} (raise --max-context)"
    )]
    ContextFull { needed: usize, capacity: usize },
    #[error(
        "vocabulary mismatch: the tokenizer has {tokenizer} tokens but {tensor} has {rows} rows (a model and tokenizer of different vocabularies)"
    )]
    VocabMismatch { tokenizer: usize, tensor: &'static str, rows: usize },
    #[error("token id {id} out of range (vocabulary has {vocab} tokens)")]
    BadToken { id: u32, vocab: usize },
    #[error("empty input: nothing to evaluate")]
    EmptyInput,
    #[error("default model: {0}")]
    Fetch(String),
    #[error("{path}: {source}")]
    Qwen4Exp { path: PathBuf, source: Box<crate::model::qwen4exp::Qwen4ExpError> },
    /// A qwen4exp forward error (the file was named when it loaded). Boxed: the error type is
    /// large and `Result<_, EngineError>` is returned on hot paths.
    #[error("qwen4exp: {0}")]
    Flash(Box<crate::model::qwen4exp::Qwen4ExpError>),
    #[error("{0}")]
    Unsupported(String),
    #[error("session of one model family passed to the other")]
    SessionMismatch,
    /// A GPU backend failure (device, kernel launch, upload), with what was being done.
    #[error("GPU: {0}")]
    Gpu(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The forward pass produced NaN or infinity: the model file's weights or metadata hold a
    /// non-finite value. `layer`: the first layer after which the residual stream held one
    /// (found with `STRATA_CHECK_FINITE=1`); None: seen in the logits.
    #[error(
        "non-finite {} at position {position} (token {token}): {count} of {of} values are NaN or infinite; the model's weights or metadata hold NaN or infinity{}",
        .layer.map_or("logits".to_string(), |l| format!("values in the residual stream after layer {l}")),
        if .layer.is_none() { " (STRATA_CHECK_FINITE=1 names the first layer that produces one)" } else { "" }
    )]
    NonFinite { position: usize, token: u32, layer: Option<usize>, count: usize, of: usize },
}

impl From<crate::model::qwen4exp::Qwen4ExpError> for EngineError {
    fn from(e: crate::model::qwen4exp::Qwen4ExpError) -> Self {
        EngineError::Flash(Box::new(e))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
