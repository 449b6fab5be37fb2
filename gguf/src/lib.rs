//! GGUF model files: a defensive reader over memory maps, and a writer for tests.
//!
//! [`GgufFile::open`] maps the file (and, for a split model named
//! `<prefix>-00001-of-0000N.gguf`, all of its siblings), parses the header, every metadata
//! value and every tensor info, and validates the lot before returning: tensor data lies inside
//! its file, is aligned to `general.alignment`, does not overlap other tensors, tensor names
//! are unique across shards, shapes do not overflow and rows are whole quantization blocks.
//! Afterwards [`GgufFile::tensor_data`] is a plain slice of the mapping. Every failure is a
//! [`GgufError`] naming the file, key or tensor and byte offset; nothing panics on bad input.
//!
//! [`inspect`] reads a model the forgiving way for diagnosis (`strata gguf`): everything that
//! can be read, and every problem rather than the first (module [`check`]).
//!
//! [`GgufWriter`] writes the same format (one file or N shards), which the tests use to build
//! synthetic models and corrupt them.

pub mod check;
mod error;
mod parse;
mod split;
mod value;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use check::{FileReport, ModelReport, TensorEntry, inspect, inspect_bytes};
pub use error::GgufError;
pub use split::{split_path, split_prefix};
pub use value::Value;
pub use writer::GgufWriter;

/// One tensor: where it lives and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the number of rows, ...
    pub dims: Vec<u64>,
    pub ty: quant::GgmlType,
    /// Offset relative to the start of its file's data section, as stored in the file.
    pub offset: u64,
    pub n_bytes: usize,
    /// Which shard of a split model holds the data (0 for single-file models).
    pub file_index: usize,
}

impl TensorInfo {
    /// Number of elements (product of dims; validated not to overflow at open).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The layer block `N` of a `blk.N.*` tensor (None for the others).
    pub fn block(&self) -> Option<usize> {
        self.name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
    }
}

/// Bytes of a file: a read-only memory map, or an owned buffer (tests, [`GgufFile::from_bytes`]).
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

struct Shard {
    path: PathBuf,
    data: Backing,
    data_offset: u64,
    version: u32,
    alignment: u64,
}

/// One model, possibly split over several files (all mapped).
pub struct GgufFile {
    shards: Vec<Shard>,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("paths", &self.paths())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn map_file(path: &Path) -> Result<Backing, GgufError> {
    let io = |source| GgufError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        // Opening a directory succeeds on Unix; mapping it fails with an obscure ENODEV.
        return Err(io(std::io::Error::other("is a directory, not a GGUF file")));
    }
    let len = meta.len();
    if len == 0 {
        // Mapping an empty file fails on some systems; the parser reports it as truncated.
        return Ok(Backing::Owned(Vec::new()));
    }
    // SAFETY: the mapping is read-only and private to this process. Like every mmap-based model
    // loader we rely on the file not being truncated or rewritten while it is open; the parser
    // validated all offsets against the length seen at open.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Backing::Mmap(map))
}

fn load_shard(path: &Path, data: Backing) -> Result<(Shard, parse::ParsedFile), GgufError> {
    let parsed = parse::parse(path, data.bytes())?;
    let shard = Shard {
        path: path.to_path_buf(),
        data,
        data_offset: parsed.data_offset,
        version: parsed.version,
        alignment: parsed.alignment,
    };
    Ok((shard, parsed))
}

impl GgufFile {
    /// Opens a model. A path named `<prefix>-0000K-of-0000N.gguf` (any K) opens all N shards:
    /// metadata comes from the first, tensors from every shard.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let paths = match split::parse_split_name(path) {
            Some((prefix, _, count)) if count > 1 => (1..=count).map(|i| split_path(&prefix, i, count)).collect(),
            _ => vec![path.to_path_buf()],
        };
        let mut parts = Vec::with_capacity(paths.len());
        for p in &paths {
            parts.push(load_shard(p, map_file(p)?)?);
        }
        Self::assemble(parts)
    }

    /// Parses a single, unsplit file from memory; `name` is used in error messages.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let part = load_shard(Path::new(name), Backing::Owned(bytes))?;
        Self::assemble(vec![part])
    }

    fn assemble(parts: Vec<(Shard, parse::ParsedFile)>) -> Result<GgufFile, GgufError> {
        let n_shards = parts.len();
        split::check_split_keys(&parts)?;
        let mut shards = Vec::with_capacity(n_shards);
        let mut metadata = Vec::new();
        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for (i, (shard, parsed)) in parts.into_iter().enumerate() {
            if i == 0 {
                metadata = parsed.metadata;
            }
            for (mut t, info_offset) in parsed.tensors.into_iter().zip(parsed.info_offsets) {
                t.file_index = i;
                if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::DuplicateTensor {
                        path: shard.path.clone(),
                        tensor: t.name,
                        offset: info_offset,
                    });
                }
                tensors.push(t);
            }
            shards.push(shard);
        }
        let key_index = metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let g = GgufFile { shards, metadata, key_index, tensors, tensor_index };
        split::check_tensor_total(&g)?;
        Ok(g)
    }

    /// The files of this model, shard order.
    pub fn paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// GGUF version of the first file (2 or 3).
    pub fn version(&self) -> u32 {
        self.shards[0].version
    }

    /// Data alignment of the first file (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.shards[0].alignment
    }

    /// Absolute byte offset of the data section of shard `file_index`.
    pub fn data_offset(&self, file_index: usize) -> Option<u64> {
        self.shards.get(file_index).map(|s| s.data_offset)
    }

    /// Metadata of the first file, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Frees the values of the named array keys (the keys stay, as empty arrays): the
    /// tokenizer's vocabulary arrays once the tokenizer holds its own copy (Gemma 3's 262k
    /// tokens, scores and types are ~30 MB as `Value`s). Later reads see an empty array.
    pub fn release_arrays(&mut self, keys: &[&str]) {
        for key in keys {
            if let Some(&i) = self.key_index.get(*key)
                && let Value::Array(a) = &mut self.metadata[i].1
            {
                *a = Vec::new();
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn path0(&self) -> PathBuf {
        self.shards[0].path.clone()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey { path: self.path0(), key: key.to_string() })
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            path: self.path0(),
            key: key.to_string(),
            expected,
            found: format!("{} {v}", v.type_name()),
        }
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        v.as_u32().ok_or_else(|| self.wrong(key, "an integer that fits in u32", v))
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| self.wrong(key, "an integer that fits in u64", v))
    }

    /// Any integer type whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.require(key)?;
        v.as_i64().ok_or_else(|| self.wrong(key, "an integer that fits in i64", v))
    }

    /// f32, f64 (narrowed) or an integer.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| self.wrong(key, "a number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong(key, "a bool", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "a string", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, "an array", v))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// All tensors: shard order, file order within a shard.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor. Bounds were validated at open; a `TensorInfo` that did not come
    /// from this file and does not fit gives an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let Some(shard) = self.shards.get(t.file_index) else {
            return &[];
        };
        let start = shard.data_offset.checked_add(t.offset).and_then(|s| usize::try_from(s).ok());
        start
            .and_then(|s| s.checked_add(t.n_bytes).map(|e| (s, e)))
            .and_then(|(s, e)| shard.data.bytes().get(s..e))
            .unwrap_or(&[])
    }
}
