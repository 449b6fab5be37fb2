//! `strata gguf FILE [--check] [--json]`: a GGUF model's header, metadata, tensor table and
//! split shards, or (`--check`) every problem in it. What is valid GGUF is decided by the
//! `gguf` crate (`gguf::inspect`, module `gguf::check`); this file only prints.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use ::gguf::{FileReport, GgufError, ModelReport, TensorEntry, Value};
use anyhow::{Result, bail};
use clap::Args;
use serde_json::json;

#[derive(Args, Debug, Clone)]
pub struct GgufArgs {
    /// The GGUF file. For a split model (`<prefix>-0000K-of-0000N.gguf`) any shard names the
    /// whole model: all N shards are read. Shards are numbered from 1, like the file names.
    pub file: PathBuf,
    /// Validate instead of listing: every bound in every shard (header and metadata
    /// truncation, tensor data inside its file, alignment, overlapping tensors, unknown tensor
    /// types, rows that are not whole quantization blocks, duplicate keys and tensor names,
    /// missing, extra or inconsistent split shards). Prints one line per problem, naming the
    /// file, the key or tensor and the byte offset. Exit status 0 when the model is clean, 1
    /// otherwise (listing a damaged file also exits with 1).
    #[arg(long)]
    pub check: bool,
    /// One JSON object instead of text: `files` (header fields and size of every shard),
    /// `metadata` (complete values), `tensors` (`offset` relative to the data section as
    /// stored, `file_offset` absolute), `problems` (`kind`, `file`, `message`) and `ok`.
    /// With --check only `files`, `problems` and `ok`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &GgufArgs) -> Result<()> {
    let report = ::gguf::inspect(&a.file);
    // A well-formed file can still be no model the engine runs (a block count beyond its
    // tensors, a NaN norm weight, a window of 0): --check loads it as the engine does.
    // A file without `general.architecture` is a plain container, not a model: not loaded.
    let is_model = report.files[0].get("general.architecture").is_some();
    let refused = if (a.check || a.json) && report.is_clean() && is_model { engine_refusal(&a.file) } else { None };
    let text = if a.json {
        serde_json::to_string_pretty(&to_json(&report, !a.check, refused.as_deref()))? + "\n"
    } else if a.check {
        check_text(&report, refused.as_deref())
    } else {
        listing(&report)
    };
    emit(&text)?;
    let problems: Vec<&GgufError> = report.all_problems().collect();
    let file = a.file.display();
    if let Some(why) = refused {
        bail!("{file}: the engine refuses this model: {why}");
    }
    if problems.is_empty() {
        return Ok(());
    }
    let summary = format!("{file}: {}", count(problems.len(), "problem"));
    if a.check || a.json {
        bail!(summary);
    }
    // The listing went to stdout; say on stderr why it may be incomplete.
    /// Problems named after a listing; `--check` prints all of them.
    const SHOWN: usize = 10;
    let mut msg = summary;
    for p in problems.iter().take(SHOWN) {
        let _ = write!(msg, "\n  {p}");
    }
    if problems.len() > SHOWN {
        let _ =
            write!(msg, "\n  ... and {} more (`strata gguf --check {file}` lists them all)", problems.len() - SHOWN);
    }
    bail!(msg)
}

/// Writes to stdout; a closed pipe (`strata gguf m.gguf | head`) is not an error.
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_string(), |v| v.to_string())
}

/// Why the engine would refuse a well-formed file: the load's own validation (architecture,
/// hyperparameters, tensor shapes and types, tokenizer, small tensors finite), run on the CPU
/// with every weight left mapped, so nothing large is read.
fn engine_refusal(path: &std::path::Path) -> Option<String> {
    let opts = crate::engine::RunOptions { mmap: true, mmap_experts: true, max_context: 1, ..Default::default() };
    crate::engine::Engine::load(path, opts).err().map(|e| e.to_string())
}

/// `--check` text: one line per problem, or a one-line summary of a clean model.
fn check_text(r: &ModelReport, refused: Option<&str>) -> String {
    let mut s = String::new();
    for p in r.all_problems() {
        let _ = writeln!(s, "{p}");
    }
    if let Some(why) = refused {
        let _ = writeln!(s, "{}: well-formed GGUF, but the engine refuses it: {why}", r.files[0].path.display());
    } else if r.is_clean() {
        let f = &r.files[0];
        let tensors: usize = r.files.iter().map(|f| f.tensors.len()).sum();
        let data: u64 = r.files.iter().map(FileReport::tensor_bytes).sum();
        let _ = writeln!(
            s,
            "{}: OK: GGUF v{}, {}, {}, {data} bytes of tensor data",
            f.path.display(),
            opt(f.version),
            count(r.files.len(), "file"),
            count(tensors, "tensor"),
        );
    }
    s
}

fn listing(r: &ModelReport) -> String {
    let mut s = String::new();
    let first = &r.files[0];
    let row = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "{k:<12} {v}");
    };
    row(&mut s, "file", first.path.display().to_string());
    row(&mut s, "size", format!("{} bytes", first.len));
    row(&mut s, "version", opt(first.version));
    row(&mut s, "tensors", opt(first.tensor_count));
    row(&mut s, "kv pairs", opt(first.kv_count));
    row(&mut s, "alignment", first.alignment.to_string());
    row(&mut s, "data offset", opt(first.data_offset));

    if r.files.len() > 1 {
        let tensors: usize = r.files.iter().map(|f| f.tensors.len()).sum();
        let bytes: u64 = r.files.iter().map(|f| f.len).sum();
        let _ = writeln!(s, "\nshards ({}, {}, {bytes} bytes)", r.files.len(), count(tensors, "tensor"));
        let width = r.files.iter().map(|f| f.path.display().to_string().len()).max().unwrap_or(0);
        for (i, f) in r.files.iter().enumerate() {
            let path = f.path.display().to_string();
            let facts = match f.version {
                None => "unreadable".to_string(),
                Some(v) => format!(
                    "{:>12} {:>12} bytes   v{v}, {} kv pairs, alignment {}, data offset {}",
                    count(f.tensors.len(), "tensor"),
                    f.len,
                    opt(f.kv_count),
                    f.alignment,
                    opt(f.data_offset)
                ),
            };
            let _ = writeln!(s, "  {:>3}  {path:<width$}  {facts}", i + 1);
        }
    }

    let read = |n: usize, announced: Option<u64>, what: &str| match announced {
        Some(a) if a == n as u64 => count(n, what),
        a => format!("{} read of {} announced", count(n, what), opt(a)),
    };
    let _ = writeln!(s, "\nmetadata ({})", read(first.metadata.len(), first.kv_count, "key"));
    let kw = first.metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let tw = first.metadata.iter().map(|(_, v)| type_label(v).len()).max().unwrap_or(0);
    for (k, v) in &first.metadata {
        let _ = writeln!(s, "  {k:<kw$}  {:<tw$}  {}", type_label(v), show(v));
    }

    let split = r.files.len() > 1;
    let n: usize = r.files.iter().map(|f| f.tensors.len()).sum();
    let announced = r.files.iter().map(|f| f.tensor_count).sum::<Option<u64>>();
    let _ = writeln!(s, "\ntensors ({}; offset = absolute byte in its file)", read(n, announced, "tensor"));
    let rows: Vec<[String; 6]> = r
        .tensors()
        .map(|(i, t)| {
            let f = &r.files[i];
            [(i + 1).to_string(), t.name.clone(), t.type_name(), shape(t), opt(f.file_offset(t)), opt(t.n_bytes)]
        })
        .collect();
    let head = ["shard", "name", "type", "shape", "offset", "bytes"].map(String::from);
    let mut w = [0usize; 6];
    for cells in std::iter::once(&head).chain(&rows) {
        for (w, c) in w.iter_mut().zip(cells) {
            *w = (*w).max(c.len());
        }
    }
    for c in std::iter::once(&head).chain(&rows) {
        let shard = if split { format!("{:>w$}  ", c[0], w = w[0]) } else { String::new() };
        let _ = writeln!(
            s,
            "  {shard}{:<w1$}  {:<w2$}  {:<w3$}  {:>w4$}  {:>w5$}",
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4],
            w5 = w[5]
        );
    }
    s
}

fn shape(t: &TensorEntry) -> String {
    let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// `string`, `u32`, `[string]`, `[[i32]]`.
fn type_label(v: &Value) -> String {
    match v {
        Value::Array(a) => match a.first() {
            Some(e) => format!("[{}]", type_label(e)),
            None => "[]".to_string(),
        },
        v => v.type_name().to_string(),
    }
}

/// A value on one line: long strings cut, long arrays as `[49152 strings: "a", "b", "c", ...]`.
fn show(v: &Value) -> String {
    match v {
        Value::Str(s) => show_str(s, 100),
        Value::Array(a) => show_array(a),
        v => v.to_string(),
    }
}

fn show_str(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(max_chars).collect();
    format!("{head:?}... ({} bytes)", s.len())
}

fn show_array(a: &[Value]) -> String {
    /// Arrays up to this long are shown whole; longer ones by their first few elements.
    const WHOLE: usize = 8;
    const HEAD: usize = 3;
    let elem = |v: &Value| match v {
        Value::Str(s) => show_str(s, 40),
        Value::Array(inner) => show_array(inner),
        v => v.to_string(),
    };
    let take = if a.len() <= WHOLE { WHOLE } else { HEAD };
    let elems: Vec<String> = a.iter().take(take).map(elem).collect();
    if a.len() <= WHOLE {
        return format!("[{}]", elems.join(", "));
    }
    let ty = a.first().map_or("value", Value::type_name);
    format!("[{} {ty}s: {}, ...]", a.len(), elems.join(", "))
}

fn value_json(v: &Value) -> serde_json::Value {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        // NaN and infinities have no JSON form: null.
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::Str(x) => json!(x),
        Value::Array(a) => a.iter().map(value_json).collect(),
    }
}

fn to_json(r: &ModelReport, full: bool, refused: Option<&str>) -> serde_json::Value {
    let files: Vec<serde_json::Value> = r
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            json!({
                "path": f.path.display().to_string(),
                "shard": i + 1,
                "size": f.len,
                "version": f.version,
                "tensor_count": f.tensor_count,
                "kv_count": f.kv_count,
                "alignment": f.alignment,
                "data_offset": f.data_offset,
                "tensors_read": f.tensors.len(),
                "tensor_bytes": f.tensor_bytes(),
            })
        })
        .collect();
    let problems: Vec<serde_json::Value> = r
        .all_problems()
        .map(|p| {
            json!({
                "kind": p.kind(),
                "file": p.path().map(|p| p.display().to_string()),
                "message": p.to_string(),
            })
        })
        .collect();
    let mut problems = problems;
    if let Some(why) = refused {
        problems.push(json!({ "kind": "model", "file": r.files[0].path.display().to_string(), "message": why }));
    }
    let mut out = json!({ "ok": problems.is_empty(), "files": files, "problems": problems });
    if full {
        let metadata: Vec<serde_json::Value> = r.files[0]
            .metadata
            .iter()
            .map(|(k, v)| json!({ "key": k, "type": type_label(v), "value": value_json(v) }))
            .collect();
        let tensors: Vec<serde_json::Value> = r
            .tensors()
            .map(|(i, t)| {
                json!({
                    "name": t.name,
                    "shard": i + 1,
                    "type": t.type_name(),
                    "type_code": t.type_code,
                    "shape": t.dims,
                    "offset": t.offset,
                    "file_offset": r.files[i].file_offset(t),
                    "bytes": t.n_bytes,
                    "info_offset": t.info_offset,
                })
            })
            .collect();
        out["metadata"] = metadata.into();
        out["tensors"] = tensors.into();
    }
    out
}
