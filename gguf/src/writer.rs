//! GGUF v3 writer: metadata + tensors, aligned data, optionally split into N shards the way
//! llama.cpp's `gguf-split` does (`split.no`/`split.count`/`split.tensors.count` in every shard,
//! all other metadata only in the first). Used by tests to build synthetic models.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use quant::GgmlType;

use crate::parse::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, tensor_bytes};
use crate::split::{KEY_COUNT, KEY_NO, KEY_TENSORS, split_path};
use crate::value::code;
use crate::{GgufError, Value};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    bytes: Vec<u8>,
}

/// Builds a GGUF model in memory and writes it out.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds (or replaces) a key. `general.alignment` (u32 power of two) sets the data alignment.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` = row length). Shape and byte count are
    /// checked by `write`.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor { name: name.into(), dims: dims.to_vec(), ty, bytes: bytes.into() });
        self
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(*a as u64),
            Some((_, v)) => Err(GgufError::Writer(format!("general.alignment must be a u32 power of two, got {v}"))),
        }
    }

    fn validate(&self) -> Result<(), GgufError> {
        let mut names = HashSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::Writer(format!("duplicate tensor {:?}", t.name)));
            }
            if t.dims.len() > MAX_DIMS as usize {
                return Err(GgufError::Writer(format!("tensor {:?}: {} dims", t.name, t.dims.len())));
            }
            let n = tensor_bytes(&t.dims, t.ty).map_err(|r| GgufError::Writer(format!("tensor {:?}: {r}", t.name)))?;
            if n != t.bytes.len() {
                return Err(GgufError::Writer(format!(
                    "tensor {:?}: {} {:?} needs {n} bytes, got {}",
                    t.name,
                    t.ty.name(),
                    t.dims,
                    t.bytes.len()
                )));
            }
        }
        Ok(())
    }

    /// The whole single-file model as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        self.validate()?;
        let all: Vec<&PendingTensor> = self.tensors.iter().collect();
        encode_file(&self.metadata, &all, self.alignment()?)
    }

    pub fn write(&self, path: &Path) -> Result<(), GgufError> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| GgufError::Io { path: path.to_path_buf(), source })
    }

    /// Writes `n` shards `<prefix>-0000K-of-0000N.gguf`, tensors distributed in order into
    /// contiguous, nearly equal groups. Returns the shard paths.
    pub fn write_split(&self, path_prefix: &str, n: u32) -> Result<Vec<PathBuf>, GgufError> {
        let t = self.tensors.len();
        let bounds: Vec<usize> = (0..=n as usize).map(|i| i * t / n.max(1) as usize).collect();
        self.write_split_at(path_prefix, &bounds)
    }

    /// Like [`write_split`](Self::write_split) with explicit group boundaries: shard `i` holds
    /// tensors `bounds[i]..bounds[i + 1]` (so `bounds` has N + 1 non-decreasing entries,
    /// starting at 0 and ending at the tensor count).
    pub fn write_split_at(&self, path_prefix: &str, bounds: &[usize]) -> Result<Vec<PathBuf>, GgufError> {
        self.validate()?;
        let n = bounds.len().saturating_sub(1);
        let ok = (1..=99_999).contains(&n)
            && bounds[0] == 0
            && bounds[n] == self.tensors.len()
            && bounds.windows(2).all(|w| w[0] <= w[1]);
        if !ok {
            return Err(GgufError::Writer(format!("bad split bounds {bounds:?} for {} tensors", self.tensors.len())));
        }
        let align = self.alignment()?;
        let mut paths = Vec::with_capacity(n);
        for i in 0..n {
            let mut meta: Vec<(String, Value)> = if i == 0 {
                self.metadata.iter().filter(|(k, _)| !k.starts_with("split.")).cloned().collect()
            } else {
                self.metadata.iter().filter(|(k, _)| k == "general.alignment").cloned().collect()
            };
            meta.push((KEY_NO.into(), Value::U16(i as u16)));
            meta.push((KEY_COUNT.into(), Value::U16(n as u16)));
            meta.push((KEY_TENSORS.into(), Value::I32(self.tensors.len() as i32)));
            let group: Vec<&PendingTensor> = self.tensors[bounds[i]..bounds[i + 1]].iter().collect();
            let bytes = encode_file(&meta, &group, align)?;
            let path = split_path(path_prefix, i as u32 + 1, n as u32);
            std::fs::write(&path, bytes).map_err(|source| GgufError::Io { path: path.clone(), source })?;
            paths.push(path);
        }
        Ok(paths)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Element type of an array: that of its first element (an empty array is written as u8[]).
fn array_elem_type(a: &[Value]) -> Result<u32, GgufError> {
    let ty = a.first().map_or(code::U8, Value::type_code);
    if a.iter().any(|v| v.type_code() != ty) {
        return Err(GgufError::Writer("array elements of mixed types".into()));
    }
    Ok(ty)
}

fn put_value(out: &mut Vec<u8>, v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&array_elem_type(a)?.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                put_value(out, e)?;
            }
        }
    }
    Ok(())
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = out.len() as u64;
    out.resize(len.div_ceil(align) as usize * align as usize, 0);
}

fn encode_file(meta: &[(String, Value)], tensors: &[&PendingTensor], align: u64) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut out, k);
        out.extend_from_slice(&v.type_code().to_le_bytes());
        put_value(&mut out, v)?;
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(t.ty as u32).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + t.bytes.len() as u64).div_ceil(align) * align;
    }
    pad_to(&mut out, align);
    for t in tensors {
        out.extend_from_slice(&t.bytes);
        pad_to(&mut out, align);
    }
    Ok(out)
}
