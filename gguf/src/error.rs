//! Typed errors. Every variant that comes from a file names the file and, where it applies,
//! the key or tensor and the byte offset at which the problem was found.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {magic:#010x} at byte 0)")]
    BadMagic { path: PathBuf, magic: u32 },
    #[error("{path}: unsupported GGUF version {version} at byte 4 (only 2 and 3 are read)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error(
        "{path}: big-endian GGUF (version {version} at byte 4 reads byte-swapped); only little-endian files are supported"
    )]
    BigEndian { path: PathBuf, version: u32 },
    #[error("{path}: truncated: {what} needs {needed} bytes at byte {offset}, file has {len}")]
    Truncated { path: PathBuf, what: String, offset: u64, needed: u64, len: u64 },
    #[error("{path}: {what} at byte {offset}: count {count} cannot fit in the {remaining} bytes left")]
    CountTooLarge { path: PathBuf, what: String, offset: u64, count: u64, remaining: u64 },
    #[error("{path}: key {key:?} at byte {offset}: unknown value type {ty}")]
    UnknownValueType { path: PathBuf, key: String, offset: u64, ty: u32 },
    #[error("{path}: key {key:?} at byte {offset}: {reason}")]
    BadValue { path: PathBuf, key: String, offset: u64, reason: String },
    #[error("{path}: duplicate key {key:?} at byte {offset}")]
    DuplicateKey { path: PathBuf, key: String, offset: u64 },
    #[error("{path}: tensor {tensor:?} at byte {offset}: unknown ggml type {ty}")]
    UnknownTensorType { path: PathBuf, tensor: String, offset: u64, ty: u32 },
    #[error("{path}: tensor {tensor:?} at byte {offset}: bad shape {dims:?}: {reason}")]
    BadShape { path: PathBuf, tensor: String, offset: u64, dims: Vec<u64>, reason: String },
    #[error(
        "{path}: tensor {tensor:?} at byte {offset}: data offset {data_offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        path: PathBuf,
        tensor: String,
        /// Where the tensor info starts.
        offset: u64,
        /// The offset stored in the info, relative to the data section.
        data_offset: u64,
        alignment: u64,
    },
    #[error("{path}: tensor {tensor:?}: data [{start}, {end}) lies outside the file ({len} bytes)")]
    OutOfRange { path: PathBuf, tensor: String, start: u64, end: u64, len: u64 },
    #[error("{path}: tensors {first:?} and {second:?} overlap at byte {offset}")]
    Overlap { path: PathBuf, first: String, second: String, offset: u64 },
    #[error("{path}: duplicate tensor name {tensor:?} (info at byte {offset})")]
    DuplicateTensor { path: PathBuf, tensor: String, offset: u64 },
    #[error("{path}: split: {reason}")]
    Split { path: PathBuf, reason: String },
    #[error("{path}: metadata key {key:?} not found")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key {key:?}: expected {expected}, found {found}")]
    WrongType { path: PathBuf, key: String, expected: &'static str, found: String },
    #[error("writer: {0}")]
    Writer(String),
}

impl GgufError {
    /// A stable name for the kind of problem (machine-readable output, e.g. `strata gguf --json`).
    pub fn kind(&self) -> &'static str {
        match self {
            GgufError::Io { .. } => "io",
            GgufError::BadMagic { .. } => "bad_magic",
            GgufError::UnsupportedVersion { .. } => "unsupported_version",
            GgufError::BigEndian { .. } => "big_endian",
            GgufError::Truncated { .. } => "truncated",
            GgufError::CountTooLarge { .. } => "count_too_large",
            GgufError::UnknownValueType { .. } => "unknown_value_type",
            GgufError::BadValue { .. } => "bad_value",
            GgufError::DuplicateKey { .. } => "duplicate_key",
            GgufError::UnknownTensorType { .. } => "unknown_tensor_type",
            GgufError::BadShape { .. } => "bad_shape",
            GgufError::Misaligned { .. } => "misaligned",
            GgufError::OutOfRange { .. } => "out_of_range",
            GgufError::Overlap { .. } => "overlap",
            GgufError::DuplicateTensor { .. } => "duplicate_tensor",
            GgufError::Split { .. } => "split",
            GgufError::MissingKey { .. } => "missing_key",
            GgufError::WrongType { .. } => "wrong_type",
            GgufError::Writer(_) => "writer",
        }
    }

    /// The file the problem is in (none for writer errors).
    pub fn path(&self) -> Option<&Path> {
        match self {
            GgufError::Io { path, .. }
            | GgufError::BadMagic { path, .. }
            | GgufError::UnsupportedVersion { path, .. }
            | GgufError::BigEndian { path, .. }
            | GgufError::Truncated { path, .. }
            | GgufError::CountTooLarge { path, .. }
            | GgufError::UnknownValueType { path, .. }
            | GgufError::BadValue { path, .. }
            | GgufError::DuplicateKey { path, .. }
            | GgufError::UnknownTensorType { path, .. }
            | GgufError::BadShape { path, .. }
            | GgufError::Misaligned { path, .. }
            | GgufError::OutOfRange { path, .. }
            | GgufError::Overlap { path, .. }
            | GgufError::DuplicateTensor { path, .. }
            | GgufError::Split { path, .. }
            | GgufError::MissingKey { path, .. }
            | GgufError::WrongType { path, .. } => Some(path),
            GgufError::Writer(_) => None,
        }
    }
}
