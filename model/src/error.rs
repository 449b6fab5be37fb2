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
    /// `expected`: its ggml shape when the loader knows it (`None` where any size is allowed;
    /// empty: unknown), what a user needs to fix a converted file.
    #[error("tensor {name:?} not found{}", if expected.is_empty() { String::new() } else { format!(" (expected ggml shape {})", shape(expected)) })]
    MissingTensor { name: String, expected: Vec<Option<u64>> },
    /// `expected`: ggml dims, `None` where any size is allowed (the vocabulary of a head).
    #[error(
        "tensor '{name}': shape {found:?}, expected {} (its dimensions follow the metadata: embedding_length, head counts, key_length, feed_forward_length, expert counts)",
        shape(expected)
    )]
    TensorShape { name: String, expected: Vec<Option<u64>>, found: Vec<u64> },
    /// A norm weight, bias or scale holding NaN or infinity: every output would be non-finite.
    #[error("tensor '{name}': value {index} is {value} (norm weights, biases and scales must be finite numbers)")]
    NonFiniteWeight { name: String, index: usize, value: f32 },
    /// What a session needs (KV cache, recurrent state) does not fit the memory there is.
    #[error("{0}")]
    Memory(String),
    #[error("tensor '{name}': type {ty} is not supported here ({why})")]
    TensorType { name: String, ty: &'static str, why: &'static str },
    #[error("metadata '{key}': {why}")]
    BadMetadata { key: String, why: String },
    #[error("request needs {needed} positions but the context holds {capacity} (raise --max-context)")]
    ContextFull { needed: usize, capacity: usize },
    #[error(
        "vocabulary mismatch: the tokenizer has {tokenizer} tokens but {tensor} has {rows} rows (a model and tokenizer of different vocabularies)"
    )]
    VocabMismatch { tokenizer: usize, tensor: &'static str, rows: usize },
    #[error("empty input: nothing to evaluate")]
    EmptyInput,
    #[error("default model: {0}")]
    Fetch(String),
    /// An error about one file (a qwen4exp model's load, an MTP head) that does not name it.
    #[error("{path}: {source}")]
    InFile { path: PathBuf, source: Box<EngineError> },
    /// A GGUF read (metadata, tensor data) whose file the caller names ([`EngineError::InFile`]).
    #[error(transparent)]
    GgufRead(#[from] gguf::GgufError),
    #[error("general.architecture is {0:?}, not \"qwen4exp\"")]
    WrongArchitecture(String),
    #[error("metadata key {key:?} not found")]
    MissingKey { key: String },
    #[error("tensor {name:?}: {source}")]
    Tensor { name: String, source: MatError },
    /// A weight block whose scale is NaN or infinite: the file is corrupt (every product with
    /// its rows would be NaN).
    #[error("tensor '{name}': {source}")]
    BadBlock { name: String, source: MatError },
    /// A weight type no backend runs; the message lists the ones they do.
    #[error(
        "tensor '{name}': type {ty} is not supported here (no kernel for this type; supported: {})",
        supported_types()
    )]
    UnsupportedType { name: String, ty: &'static str },
    #[error("tensor {name:?}: cannot dequantize: {reason}")]
    Dequant { name: String, reason: String },
    #[error("forward at position {got}, but the sequence state is at position {expected}")]
    Position { expected: usize, got: usize },
    #[error("token {token} at batch index {index} is outside the vocabulary of {n_vocab}")]
    BadTokenAt { token: u32, index: usize, n_vocab: usize },
    #[error(
        "this file holds only the MTP (nextn) draft head, not the model trunk: pass it with \
         --mtp and the trunk with -m"
    )]
    MtpOnly,
    #[error("MTP head {path:?}: {reason}")]
    MtpFile { path: PathBuf, reason: String },
    #[error("MTP head {path:?}: {source}")]
    Mtp { path: PathBuf, source: Box<EngineError> },
    #[error("MTP head input: {got} hidden values for {tokens} tokens of width {width}")]
    MtpInput { got: usize, tokens: usize, width: usize },
    #[error("metadata key {key:?} is {mtp} in the MTP file but {model} in the model")]
    MtpMismatch { key: String, mtp: String, model: String },
    #[error("sequence state does not fit this model (layer {layer})")]
    StateMismatch { layer: usize },
    #[error(
        "PLE table `per_layer_token_embd.weight` not found in {searched:?}: pass the PLE shard \
         (--ple-gguf FILE), or --ple-skip to run without it (outputs then differ from the model)"
    )]
    PleTableMissing { searched: Vec<PathBuf> },
    #[error("PLE table {path:?}: {reason}")]
    PleIo { path: PathBuf, reason: String },
    #[error("PLE layer {layer}: {reason}")]
    Ple { layer: usize, reason: String },
    #[error(
        "qwen4exp on --device {backend}: operation `{op}` (layer {layer}) is not on this backend yet (it has no gfx11 kernel; run with --device cpu)"
    )]
    NotOnBackend { backend: &'static str, op: &'static str, layer: usize },
    #[error("{0}")]
    Unsupported(String),
    #[error("session of one model family passed to the other")]
    SessionMismatch,
    /// A device asked of a build without the GPU backends (the executor's stub says so).
    #[error("{what} needs a build with GPU support (cargo build --features gpu)")]
    NoGpuSupport { what: String },
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

/// The weight types the engine loads (every type `quant` dequantizes and dots), from the
/// `quant` type table.
pub fn supported_types() -> String {
    let names: Vec<&str> = quant::ALL_TYPES.iter().filter(|t| t.has_reference()).map(|t| t.name()).collect();
    names.join(", ")
}

/// A ggml shape with `*` for a dimension of any size.
fn shape(dims: &[Option<u64>]) -> String {
    let d: Vec<String> = dims.iter().map(|d| d.map_or("*".to_string(), |v| v.to_string())).collect();
    format!("[{}]", d.join(", "))
}

impl EngineError {
    /// A [`MatError`] about tensor `name`: a bad block and an unsupported type get their own
    /// variants (the block index; the list of supported types).
    pub fn tensor(name: impl Into<String>, source: MatError) -> EngineError {
        let name = name.into();
        match source {
            MatError::Unsupported(ty) => EngineError::UnsupportedType { name, ty: ty.name() },
            source @ MatError::BadBlock { .. } => EngineError::BadBlock { name, source },
            source => EngineError::Tensor { name, source },
        }
    }

    /// `self` about the file at `path`: wrapped in [`EngineError::InFile`] unless it already
    /// names a file.
    pub fn in_file(self, path: &std::path::Path) -> EngineError {
        match self {
            e @ (EngineError::Gguf { .. }
            | EngineError::GgufRead(_)
            | EngineError::Io { .. }
            | EngineError::InFile { .. }
            | EngineError::Mtp { .. }
            | EngineError::MtpFile { .. }
            | EngineError::PleIo { .. }) => e,
            e => EngineError::InFile { path: path.to_path_buf(), source: Box::new(e) },
        }
    }
}

/// Why a matrix cannot be built from the given bytes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MatError {
    #[error("type {0:?} has no reference implementation")]
    Unsupported(quant::GgmlType),
    #[error("row length {cols} is not a whole number of {ty:?} blocks")]
    Ragged { ty: quant::GgmlType, cols: usize },
    #[error("{ty:?} {rows}x{cols} needs {expected} bytes, got {got}")]
    Size { ty: quant::GgmlType, rows: usize, cols: usize, expected: usize, got: usize },
    /// A block with a NaN or infinite scale; `bad.block` counts from the tensor's first block,
    /// `offset` is its byte offset in the tensor's data.
    #[error("{bad}, at byte {offset} of its {ty} data")]
    BadBlock { ty: quant::GgmlType, bad: quant::BadBlock, offset: usize },
    #[error("{0}")]
    Quant(quant::QuantError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
