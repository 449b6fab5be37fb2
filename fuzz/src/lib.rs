//! Shared fixtures of the fuzz targets: tokenizers built once per process from real
//! vocabularies, and small input-splitting helpers.
//!
//! Vocabularies (loaded lazily, once, in a `OnceLock`):
//! - `tiny`: the 1024-token byte-level BPE vocabulary of the synthetic test models
//!   (`testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf`, SmolLM2's first 1024
//!   tokens, pre-tokenizer `smollm`). Required: `scripts/make-testdata.sh` makes it.
//! - the real models of the test suite from the model cache (`$STRATA_MODEL_DIR`, else
//!   `~/.cache/strata/models`, as `strata fetch` fills it): Gemma 3 (SentencePiece, 262144
//!   tokens), Qwen2.5-Coder (BPE `qwen2`, 151665 tokens, the default chat model's Jinja chat
//!   template) and SmolLM2 (BPE `smollm`, 49152 tokens, its Jinja template). Optional: a
//!   missing one is left out with a note on stderr, so the targets also run on a checkout that
//!   only has the synthetic models.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gguf::{GgufFile, GgufWriter, Value};
use tokenizer::Tokenizer;

pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
pub const TINY: &str = "testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";

pub fn model_dir() -> PathBuf {
    std::env::var_os("STRATA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/strata/models"))
}

fn open_tiny() -> GgufFile {
    let p = Path::new(REPO).join(TINY);
    GgufFile::open(&p).unwrap_or_else(|e| {
        panic!("fuzz fixture {} missing or unreadable ({e}): run scripts/make-testdata.sh", p.display())
    })
}

fn open_cached(name: &str) -> Option<GgufFile> {
    let p = model_dir().join(name);
    match GgufFile::open(&p) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("strata-fuzz: {} left out ({e}); `strata fetch` puts it there", p.display());
            None
        }
    }
}

pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const SMOLLM: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A tokenizer and what it is, for assertion messages.
pub struct Named {
    pub name: &'static str,
    pub tok: Tokenizer,
    /// Bytes the vocabulary has no token for (SmolLM2's byte-level vocabulary lacks 21 of the
    /// 256, e.g. 0x1d and 0xc0): a text holding one cannot be spelled exactly, and llama.cpp
    /// drops such bytes too.
    pub unspellable: [bool; 256],
}

impl Named {
    fn new(name: &'static str, tok: Tokenizer) -> Named {
        let mut unspellable = [false; 256];
        for (b, u) in unspellable.iter_mut().enumerate() {
            let text = match tok.model_name() {
                "bpe" => gpt2_byte_char(b as u8).to_string(),
                _ => format!("<0x{b:02X}>"),
            };
            *u = tok.token_id(&text).is_none();
        }
        Named { name, tok, unspellable }
    }
}

/// GPT-2's byte-level alphabet: printable Latin-1 bytes are themselves, the other 68 bytes take
/// code points 256.. in byte order.
pub fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let b = b as u32;
    if printable(b) {
        return char::from_u32(b).unwrap_or('?');
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// Tokenizers of real vocabularies: tiny (always), then Gemma, Qwen2.5, SmolLM2 when present.
pub fn vocabularies() -> &'static [Named] {
    static V: OnceLock<Vec<Named>> = OnceLock::new();
    V.get_or_init(|| {
        let mut v =
            vec![Named::new("tiny-bpe-smollm-1024", Tokenizer::from_gguf(&open_tiny()).expect("tiny tokenizer"))];
        for (name, file) in [("gemma3-spm", GEMMA), ("qwen2.5-bpe-qwen2", QWEN), ("smollm2-bpe", SMOLLM)] {
            if let Some(g) = open_cached(file) {
                v.push(Named::new(name, Tokenizer::from_gguf(&g).expect("tokenizer of a cached model")));
            }
        }
        v
    })
}

/// The tiny vocabulary's metadata (no tensors) with `arch`, an optional stored template and
/// extra control tokens appended; parsed back into a tokenizer.
fn tiny_with(arch: &str, template: Option<&str>, extra_control: &[&str]) -> Tokenizer {
    let g = open_tiny();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = match (k.as_str(), v) {
            ("general.architecture", _) => Value::Str(arch.into()),
            ("tokenizer.ggml.tokens", Value::Array(a)) => {
                let mut a = a.clone();
                a.extend(extra_control.iter().map(|t| Value::Str(t.to_string())));
                Value::Array(a)
            }
            ("tokenizer.ggml.token_type", Value::Array(a)) => {
                let mut a = a.clone();
                a.extend(extra_control.iter().map(|_| Value::I32(3)));
                Value::Array(a)
            }
            _ => v.clone(),
        };
        w.add_metadata(k.clone(), v);
    }
    if let Some(t) = template {
        w.add_metadata("tokenizer.chat_template", Value::Str(t.into()));
    }
    let bytes = w.to_bytes().expect("writing the fixture");
    let g = GgufFile::from_bytes("fixture.gguf", bytes).expect("reading the fixture back");
    Tokenizer::from_gguf(&g).expect("fixture tokenizer")
}

fn stored_template(file: &str) -> Option<String> {
    open_cached(file)?.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string)
}

/// One tokenizer per chat template kind: the three built-in formats (ChatML, Gemma, Llama 3)
/// and the real Jinja templates of Qwen2.5-Coder and SmolLM2 when cached, all over the tiny
/// vocabulary (rendering does not depend on the vocabulary beyond the BOS/EOS texts).
pub fn chat_tokenizers() -> &'static [Named] {
    static V: OnceLock<Vec<Named>> = OnceLock::new();
    V.get_or_init(|| {
        let llama3 = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
        let mut v = vec![
            Named::new("chatml", tiny_with("qwen3moe", None, &[])),
            Named::new("gemma", tiny_with("gemma3", None, &["<start_of_turn>", "<end_of_turn>"])),
            Named::new("llama3", tiny_with("llama", None, &llama3)),
        ];
        for (name, file) in [("jinja-qwen2.5", QWEN), ("jinja-smollm2", SMOLLM)] {
            if let Some(t) = stored_template(file) {
                v.push(Named::new(name, tiny_with("qwen2", Some(&t), &[])));
            }
        }
        v
    })
}

/// Splits `data` at NUL bytes into at most `max` UTF-8 fields (lossy).
pub fn fields(data: &[u8], max: usize) -> Vec<String> {
    data.split(|&b| b == 0).take(max).map(|f| String::from_utf8_lossy(f).into_owned()).collect()
}

/// Metadata equality with floats compared bit for bit (NaN payloads, -0.0).
pub fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b)),
        _ => a == b,
    }
}

pub fn same_metadata(a: &[(String, Value)], b: &[(String, Value)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same_value(va, vb))
}

/// A GGUF file holding the default chat model's tokenizer for the server's `build_state`: the
/// cached Qwen2.5-Coder model itself, else the tiny vocabulary as a `qwen2` model (built-in
/// ChatML, no tools) written once to a temporary file.
pub fn default_model_tokenizer_file() -> PathBuf {
    let real = model_dir().join(QWEN);
    if real.is_file() {
        return real;
    }
    eprintln!("strata-fuzz: {} missing; using the tiny vocabulary as a qwen2 model", real.display());
    let g = open_tiny();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = if k == "general.architecture" { Value::Str("qwen2".into()) } else { v.clone() };
        w.add_metadata(k.clone(), v);
    }
    let p = std::env::temp_dir().join(format!("strata-fuzz-tokenizer-{}.gguf", std::process::id()));
    w.write(&p).expect("writing the stand-in tokenizer");
    p
}
