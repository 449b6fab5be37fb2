//! Parser for one GGUF file held in memory (an mmap or a byte vector).
//!
//! Layout (v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata
//! count, the metadata key/value pairs, the tensor infos (name, n_dims, dims, type, offset
//! relative to the data section), padding to `general.alignment`, then the tensor data.
//!
//! Nothing here trusts a count read from the file: every count is checked against the bytes
//! that remain before anything is allocated, all offset arithmetic is checked, and the
//! recursion into nested arrays is bounded.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use quant::GgmlType;

use crate::check::{FileReport, TensorEntry};
use crate::value::{code, min_encoded_size, type_name};
use crate::{GgufError, TensorInfo, Value};

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"GGUF");
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub(crate) const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal but nothing real nests deeply; the bound keeps recursion finite.
const MAX_ARRAY_DEPTH: usize = 8;

/// Everything read from one file.
pub(crate) struct ParsedFile {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    /// `file_index` is left 0; the caller sets it.
    pub tensors: Vec<TensorInfo>,
    /// Where each tensor's info starts (for error messages).
    pub info_offsets: Vec<u64>,
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if self.remaining() < n {
            return Err(GgufError::Truncated {
                path: self.path(),
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: usize, what: &dyn Fn() -> String) -> Result<usize, GgufError> {
        let fits = count.checked_mul(min_size as u64).is_some_and(|b| b <= self.remaining() as u64);
        if !fits {
            return Err(GgufError::CountTooLarge {
                path: self.path(),
                what: what(),
                offset: self.pos as u64,
                count,
                remaining: self.remaining() as u64,
            });
        }
        Ok(count as usize)
    }

    /// A GGUF string: u64 length + bytes. Invalid UTF-8 is replaced (lossy) rather than
    /// rejected, as ggml does not validate it either.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, &|| format!("{} (string length, at byte {start})", what()))?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, key: &str, ty: u32, depth: usize) -> Result<Value, GgufError> {
        let at = self.pos as u64;
        let what = || format!("value of key {key:?}");
        Ok(match ty {
            code::U8 => Value::U8(self.array::<1>(&what)?[0]),
            code::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            code::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            code::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            code::U32 => Value::U32(self.u32(&what)?),
            code::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            code::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            code::U64 => Value::U64(self.u64(&what)?),
            code::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            code::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            code::BOOL => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::BadValue {
                        path: self.path(),
                        key: key.to_string(),
                        offset: at,
                        reason: format!("bool byte {b} is neither 0 nor 1"),
                    });
                }
            },
            code::STR => Value::Str(self.string(&what)?),
            code::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::BadValue {
                        path: self.path(),
                        key: key.to_string(),
                        offset: at,
                        reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let ety = self.u32(&what)?;
                if type_name(ety) == "unknown" {
                    return Err(GgufError::UnknownValueType {
                        path: self.path(),
                        key: key.to_string(),
                        offset: at,
                        ty: ety,
                    });
                }
                let count = self.u64(&what)?;
                let n = self.check_count(count, min_encoded_size(ety), &|| format!("array of key {key:?}"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(key, ety, depth + 1)?);
                }
                Value::Array(v)
            }
            _ => {
                return Err(GgufError::UnknownValueType { path: self.path(), key: key.to_string(), offset: at, ty });
            }
        })
    }
}

/// Parses and validates one file: the file, or the first problem [`scan`] found.
pub(crate) fn parse(path: &Path, buf: &[u8]) -> Result<ParsedFile, GgufError> {
    let report = scan(path, buf);
    if let Some(e) = report.problems.into_iter().next() {
        return Err(e);
    }
    // With no problem every tensor has a known type and size and the data offset is known;
    // the fallbacks below only keep this panic-free.
    let data_offset = report.data_offset.unwrap_or(0);
    let mut tensors = Vec::with_capacity(report.tensors.len());
    let mut info_offsets = Vec::with_capacity(report.tensors.len());
    for t in report.tensors {
        let (Some(ty), Some(n_bytes)) = (t.ty, t.n_bytes.and_then(|n| usize::try_from(n).ok())) else {
            return Err(GgufError::BadShape {
                path: path.to_path_buf(),
                tensor: t.name,
                offset: t.info_offset,
                dims: t.dims,
                reason: "size could not be determined".into(),
            });
        };
        info_offsets.push(t.info_offset);
        tensors.push(TensorInfo { name: t.name, dims: t.dims, ty, offset: t.offset, n_bytes, file_index: 0 });
    }
    Ok(ParsedFile {
        version: report.version.unwrap_or(0),
        metadata: report.metadata,
        tensors,
        info_offsets,
        alignment: report.alignment,
        data_offset,
    })
}

/// Reads one file as far as its structure allows and records every problem on the way, in the
/// order a strict reader meets them (so the first one is what [`parse`] reports). Problems that
/// leave the layout readable (a duplicate key, a bad alignment value, a bad tensor type, shape
/// or offset) are recorded and reading goes on; the others (bad magic, truncation, an
/// unreadable value) end it.
pub(crate) fn scan(path: &Path, buf: &[u8]) -> FileReport {
    let mut report = FileReport {
        path: path.to_path_buf(),
        len: buf.len() as u64,
        version: None,
        tensor_count: None,
        kv_count: None,
        alignment: DEFAULT_ALIGNMENT,
        data_offset: None,
        metadata: Vec::new(),
        tensors: Vec::new(),
        problems: Vec::new(),
    };
    if let Err(e) = scan_into(&mut report, buf) {
        report.problems.push(e);
    }
    report
}

/// [`scan`]'s body: `Err` is a problem after which nothing more can be read.
fn scan_into(r: &mut FileReport, buf: &[u8]) -> Result<(), GgufError> {
    let path = r.path.clone();
    let mut c = Cursor { path: &path, buf, pos: 0 };
    let magic = c.u32(&|| "magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { path: c.path(), magic });
    }
    let version = c.u32(&|| "version".into())?;
    if matches!(version.swap_bytes(), 2 | 3) {
        return Err(GgufError::BigEndian { path: c.path(), version: version.swap_bytes() });
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { path: c.path(), version });
    }
    r.version = Some(version);
    let n_tensors = c.u64(&|| "tensor count".into())?;
    r.tensor_count = Some(n_tensors);
    let n_kv = c.u64(&|| "metadata count".into())?;
    r.kv_count = Some(n_kv);
    // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes.
    let n_kv = c.check_count(n_kv, 13, &|| "metadata count".into())?;

    r.metadata.reserve(n_kv);
    let mut keys = HashSet::with_capacity(n_kv);
    // Where `general.alignment` starts, for the error about its value.
    let mut alignment_at = 0;
    for i in 0..n_kv {
        let at = c.pos as u64;
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        if !keys.insert(key.clone()) {
            r.problems.push(GgufError::DuplicateKey { path: c.path(), key: key.clone(), offset: at });
        }
        let ty = c.u32(&|| format!("type of key {key:?}"))?;
        let v = c.value(&key, ty, 0)?;
        if key == "general.alignment" && alignment_at == 0 {
            alignment_at = at;
        }
        r.metadata.push((key, v));
    }

    if let Some((_, v)) = r.metadata.iter().find(|(k, _)| k == "general.alignment") {
        match v {
            Value::U32(a) if a.is_power_of_two() => r.alignment = *a as u64,
            // Reading goes on with the default, as the tensor infos do not depend on it.
            other => r.problems.push(GgufError::BadValue {
                path: c.path(),
                key: "general.alignment".into(),
                offset: alignment_at,
                reason: format!("must be a u32 power of two, found {} {other}", other.type_name()),
            }),
        }
    }
    let alignment = r.alignment;

    // name (>= 8) + n_dims (4) + type (4) + offset (8)
    let n_tensors = c.check_count(n_tensors, 24, &|| "tensor count".into())?;
    r.tensors.reserve(n_tensors);
    for i in 0..n_tensors {
        let at = c.pos as u64;
        let name = c.string(&|| format!("name of tensor {i}"))?;
        let what = || format!("info of tensor {name:?}");
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            // Stop here: a corrupt count would misplace every info after this one.
            r.problems.push(GgufError::BadShape {
                path: c.path(),
                tensor: name,
                offset: at,
                dims: vec![],
                reason: format!(
                    "{n_dims} dimensions (at most {MAX_DIMS}); the tensor infos after it cannot be located"
                ),
            });
            return Ok(());
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let type_code = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let ty = GgmlType::from_u32(type_code);
        let mut n_bytes = None;
        match ty {
            None => r.problems.push(GgufError::UnknownTensorType {
                path: c.path(),
                tensor: name.clone(),
                offset: at,
                ty: type_code,
            }),
            Some(ty) => match tensor_bytes(&dims, ty) {
                Ok(n) => n_bytes = Some(n as u64),
                Err(reason) => r.problems.push(GgufError::BadShape {
                    path: c.path(),
                    tensor: name.clone(),
                    offset: at,
                    dims: dims.clone(),
                    reason,
                }),
            },
        }
        if offset % alignment != 0 {
            r.problems.push(GgufError::Misaligned {
                path: c.path(),
                tensor: name.clone(),
                offset: at,
                data_offset: offset,
                alignment,
            });
        }
        r.tensors.push(TensorEntry { name, dims, type_code, ty, offset, n_bytes, info_offset: at });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    r.data_offset = Some(data_offset);
    let len = buf.len() as u64;
    let mut names = HashSet::with_capacity(r.tensors.len());
    for t in &r.tensors {
        if !names.insert(t.name.as_str()) {
            r.problems.push(GgufError::DuplicateTensor {
                path: c.path(),
                tensor: t.name.clone(),
                offset: t.info_offset,
            });
        }
        let Some(n_bytes) = t.n_bytes else { continue };
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        if !end.is_some_and(|e| e <= len) {
            r.problems.push(GgufError::OutOfRange {
                path: c.path(),
                tensor: t.name.clone(),
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                len,
            });
        }
    }
    check_overlaps(r, data_offset);
    Ok(())
}

/// Bytes of a tensor of shape `dims` and type `ty`, or why the shape is invalid.
pub(crate) fn tensor_bytes(dims: &[u64], ty: GgmlType) -> Result<usize, String> {
    let mut n: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return Err(format!("dimension {d} exceeds i64::MAX"));
        }
        n = n.checked_mul(d).ok_or_else(|| "element count overflows u64".to_string())?;
    }
    if n > i64::MAX as u64 {
        return Err("element count exceeds i64::MAX".into());
    }
    let row = dims.first().copied().unwrap_or(1);
    let bs = ty.block_size() as u64;
    if row % bs != 0 {
        return Err(format!("row length {row} is not a multiple of the {} block size {bs}", ty.name()));
    }
    (n / bs)
        .checked_mul(ty.type_size() as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| "byte size overflows".to_string())
}

/// Every pair of tensors whose data overlap (among those of known size inside the file).
fn check_overlaps(r: &mut FileReport, data_offset: u64) {
    let mut order: Vec<(u64, u64, &str)> = r
        .tensors
        .iter()
        .filter_map(|t| {
            let start = data_offset.checked_add(t.offset)?;
            let end = start.checked_add(t.n_bytes?)?;
            (end > start && end <= r.len).then_some((start, end, t.name.as_str()))
        })
        .collect();
    order.sort_by_key(|&(start, _, _)| start);
    // Compared with the tensor reaching furthest so far, so an overlap with any earlier tensor
    // is found; with no overlap before it, that is simply the previous one.
    let mut furthest: Option<(u64, &str)> = None;
    let mut found = Vec::new();
    for &(start, end, name) in &order {
        if let Some((f_end, f_name)) = furthest {
            if f_end > start {
                found.push(GgufError::Overlap {
                    path: r.path.clone(),
                    first: f_name.to_string(),
                    second: name.to_string(),
                    offset: start,
                });
            }
            if end <= f_end {
                continue;
            }
        }
        furthest = Some((end, name));
    }
    r.problems.extend(found);
}
