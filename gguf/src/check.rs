//! Diagnosis of a GGUF model (`strata gguf`): every file is read as far as its structure
//! allows and every problem is listed (header or metadata truncation, tensor data outside its
//! file, misalignment, overlaps, unknown tensor types, rows that are not whole blocks, duplicate
//! names, missing, extra or inconsistent split shards) instead of stopping at the first one like
//! [`GgufFile::open`](crate::GgufFile::open) does.
//!
//! Both readers share one parser, so a model whose report is clean opens; the split rules here
//! are a little stricter than the reader's and follow what llama.cpp's loader requires
//! (`split.count` in the first shard, `split.no` in every other one).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use quant::GgmlType;

use crate::split::{KEY_COUNT, KEY_NO, KEY_TENSORS, int_key, parse_split_name, split_path};
use crate::{GgufError, Value};

/// One tensor info as stored, valid or not.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    /// ggml order (`dims[0]` is the row length), as stored.
    pub dims: Vec<u64>,
    /// The type code as stored; `ty` is `None` when ggml has no such type.
    pub type_code: u32,
    pub ty: Option<GgmlType>,
    /// Relative to the file's data section, as stored.
    pub offset: u64,
    /// Bytes of data; `None` when the type is unknown or the shape invalid.
    pub n_bytes: Option<u64>,
    /// Absolute byte offset at which this tensor's info starts.
    pub info_offset: u64,
}

impl TensorEntry {
    /// ggml's type name (`q8_0`), or `unknown(N)`.
    pub fn type_name(&self) -> String {
        match self.ty {
            Some(t) => t.name().to_string(),
            None => format!("unknown({})", self.type_code),
        }
    }
}

/// What one file holds, as far as it could be read, and what is wrong with it.
#[derive(Debug)]
pub struct FileReport {
    pub path: PathBuf,
    /// File size in bytes (0 when it could not be read).
    pub len: u64,
    /// Header fields; `None` when the file is unreadable or ends (or goes wrong) before them.
    pub version: Option<u32>,
    pub tensor_count: Option<u64>,
    pub kv_count: Option<u64>,
    /// `general.alignment`, or the default 32 when it is absent or invalid.
    pub alignment: u64,
    /// Absolute offset of the data section; `None` when the tensor infos could not all be read.
    pub data_offset: Option<u64>,
    /// The key/value pairs read, in file order.
    pub metadata: Vec<(String, Value)>,
    /// The tensor infos read, in file order.
    pub tensors: Vec<TensorEntry>,
    /// Problems in this file, in file order (including the file being missing or unreadable).
    pub problems: Vec<GgufError>,
}

impl FileReport {
    fn unreadable(path: &Path, problem: GgufError) -> FileReport {
        FileReport {
            path: path.to_path_buf(),
            len: 0,
            version: None,
            tensor_count: None,
            kv_count: None,
            alignment: crate::parse::DEFAULT_ALIGNMENT,
            data_offset: None,
            metadata: Vec::new(),
            tensors: Vec::new(),
            problems: vec![problem],
        }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether every key/value pair the header announces was read.
    pub fn metadata_complete(&self) -> bool {
        self.kv_count == Some(self.metadata.len() as u64)
    }

    /// Whether the tensor table was read to its end (every tensor is listed).
    pub fn tensors_complete(&self) -> bool {
        self.data_offset.is_some()
    }

    /// Absolute byte offset of a tensor's data in this file.
    pub fn file_offset(&self, t: &TensorEntry) -> Option<u64> {
        self.data_offset?.checked_add(t.offset)
    }

    /// Bytes of tensor data (of the tensors whose size is known).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().filter_map(|t| t.n_bytes).fold(0, u64::saturating_add)
    }
}

/// A whole model: one report per file, plus the problems between files.
#[derive(Debug)]
pub struct ModelReport {
    /// One per file of the model, in shard order (a single one for an unsplit file); a missing
    /// shard has a report holding only that problem.
    pub files: Vec<FileReport>,
    /// Problems between files: split keys, extra shards, a tensor name in two shards.
    pub problems: Vec<GgufError>,
}

impl ModelReport {
    /// Every problem: each file's in shard order, then those between files.
    pub fn all_problems(&self) -> impl Iterator<Item = &GgufError> {
        self.files.iter().flat_map(|f| &f.problems).chain(&self.problems)
    }

    pub fn is_clean(&self) -> bool {
        self.all_problems().next().is_none()
    }

    /// Tensors of all files, with the index of the file holding each.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorEntry)> {
        self.files.iter().enumerate().flat_map(|(i, f)| f.tensors.iter().map(move |t| (i, t)))
    }
}

/// Reads and checks a model. A path named `<prefix>-0000K-of-0000N.gguf` (any K) checks all N
/// shards, like [`GgufFile::open`](crate::GgufFile::open) opens them. Never fails: what cannot
/// be read is a problem in the report.
pub fn inspect(path: &Path) -> ModelReport {
    let split = parse_split_name(path).filter(|&(_, _, count)| count > 1);
    let paths: Vec<PathBuf> = match &split {
        Some((prefix, _, count)) => (1..=*count).map(|i| split_path(prefix, i, *count)).collect(),
        None => vec![path.to_path_buf()],
    };
    let n = paths.len();
    let files: Vec<FileReport> = paths.iter().enumerate().map(|(i, p)| inspect_file(p, i, n, path)).collect();
    let mut problems = Vec::new();
    if let Some((prefix, _, count)) = &split {
        problems.extend(extra_shards(prefix, *count, path));
    }
    check_split(&files, &mut problems);
    ModelReport { files, problems }
}

/// Checks a single, unsplit file held in memory; `name` is used in messages.
pub fn inspect_bytes(name: &str, bytes: &[u8]) -> ModelReport {
    let files = vec![crate::parse::scan(Path::new(name), bytes)];
    let mut problems = Vec::new();
    check_split(&files, &mut problems);
    ModelReport { files, problems }
}

fn inspect_file(path: &Path, index: usize, n: usize, named: &Path) -> FileReport {
    if n > 1 && !path.exists() {
        let reason = format!("shard {} of {n} is missing (the model was named by {})", index + 1, named.display());
        return FileReport::unreadable(path, GgufError::Split { path: path.to_path_buf(), reason });
    }
    match crate::map_file(path) {
        Ok(data) => crate::parse::scan(path, data.bytes()),
        Err(e) => FileReport::unreadable(path, e),
    }
}

/// Files next to the shards with the same prefix but another shard count: leftovers of another
/// split that a glob or a copy would mix up with this model.
fn extra_shards(prefix: &str, count: u32, named: &Path) -> Vec<GgufError> {
    let (dir, stem) = match prefix.rsplit_once('/') {
        Some((d, s)) => (Some(if d.is_empty() { "/" } else { d }), s),
        None => (None, prefix),
    };
    let Ok(entries) = std::fs::read_dir(dir.unwrap_or(".")) else {
        return Vec::new();
    };
    let mut extra: Vec<(String, u32, u32)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (p, no, c) = parse_split_name(Path::new(&name))?;
            (p == stem && c != count).then_some((name, no, c))
        })
        .collect();
    extra.sort();
    extra
        .into_iter()
        .map(|(name, no, c)| GgufError::Split {
            path: match dir {
                Some(d) => Path::new(d).join(name),
                None => PathBuf::from(name),
            },
            reason: format!(
                "extra shard: named shard {no} of {c}, but {} belongs to a split into {count} files",
                named.display()
            ),
        })
        .collect()
}

/// `split.*` keys of every shard, the total tensor count, and names repeated across shards.
fn check_split(files: &[FileReport], problems: &mut Vec<GgufError>) {
    let n = files.len() as u64;
    for (i, f) in files.iter().enumerate() {
        if f.version.is_none() {
            continue; // unreadable: already reported
        }
        // A key missing from metadata that was cut short is not reported as missing.
        let complete = f.metadata_complete();
        match int_key(&f.path, &f.metadata, KEY_COUNT) {
            Err(e) => problems.push(e),
            Ok(Some(count)) if count != n && !(count == 0 && n == 1) => {
                let reason = if n == 1 {
                    format!(
                        "{KEY_COUNT} is {count} but the file name does not follow <prefix>-00001-of-{count:05}.gguf"
                    )
                } else {
                    format!("{KEY_COUNT} is {count} but the shard files are named ...-of-{n:05}.gguf")
                };
                problems.push(GgufError::Split { path: f.path.clone(), reason });
            }
            Ok(None) if n > 1 && i == 0 && complete => problems.push(GgufError::Split {
                path: f.path.clone(),
                reason: format!("{KEY_COUNT} is missing: llama.cpp would load this shard alone"),
            }),
            _ => {}
        }
        if n == 1 {
            continue;
        }
        match int_key(&f.path, &f.metadata, KEY_NO) {
            Err(e) => problems.push(e),
            Ok(Some(no)) if no != i as u64 => problems.push(GgufError::Split {
                path: f.path.clone(),
                reason: format!("{KEY_NO} is {no}, expected {i} (0-based) for shard {} of {n}", i + 1),
            }),
            Ok(None) if i > 0 && complete => problems.push(GgufError::Split {
                path: f.path.clone(),
                reason: format!("{KEY_NO} is missing (llama.cpp needs it in every shard after the first)"),
            }),
            _ => {}
        }
    }

    let first = &files[0];
    if first.version.is_some() {
        match int_key(&first.path, &first.metadata, KEY_TENSORS) {
            Err(e) => problems.push(e),
            // Only comparable when every tensor table was read.
            Ok(Some(total)) if files.iter().all(FileReport::tensors_complete) => {
                let found: usize = files.iter().map(|f| f.tensors.len()).sum();
                if total != found as u64 {
                    problems.push(GgufError::Split {
                        path: first.path.clone(),
                        reason: format!("{KEY_TENSORS} is {total} but the shards hold {found} tensors"),
                    });
                }
            }
            _ => {}
        }
    }

    // Names repeated within one file were reported by its scan.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        for t in &f.tensors {
            match seen.get(t.name.as_str()) {
                Some(&j) if j != i => problems.push(GgufError::DuplicateTensor {
                    path: f.path.clone(),
                    tensor: t.name.clone(),
                    offset: t.info_offset,
                }),
                Some(_) => {}
                None => {
                    seen.insert(&t.name, i);
                }
            }
        }
    }
}
