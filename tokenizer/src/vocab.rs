//! The vocabulary as llama.cpp derives it from GGUF metadata: token texts, scores, attributes,
//! special token ids (from `tokenizer.ggml.*_token_id`, with llama.cpp's per-model defaults and
//! its text-based auto-detection of EOT/FIM tokens), flags, and the end-of-generation set.
//!
//! llama.cpp walks an unordered map for the text-based detection; we walk ids in ascending
//! order so the result is deterministic (it only differs when a vocabulary has two candidates
//! for the same role, e.g. both `<|im_end|>` and `<|endoftext|>` for EOT, and EOT itself is not
//! exposed here; the EOG set, which is exposed, does not depend on the order).

use std::collections::{BTreeSet, HashMap};

use gguf::{GgufFile, Value};

use crate::TokenizerError;
use crate::pretok::PreTokenizer;

/// Token attribute bits, as in llama.h's `llama_token_attr`.
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// `tokenizer.ggml.token_type` values (gguf-py `TokenType`) mapped to attributes.
fn attr_of_type(t: i64) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0, // UNDEFINED
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Model {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece BPE with scores and byte fallback.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merges.
    Bpe { pre: PreTokenizer, ranks: HashMap<(String, String), u32> },
}

/// Special token ids; `None` where the vocabulary has none.
#[derive(Clone, Debug, Default)]
pub(crate) struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    pub model: Model,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub to_id: HashMap<String, u32>,
    pub sp: Specials,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub eog: BTreeSet<u32>,
    /// Tokens matched in raw text before tokenization (control, user-defined, unknown),
    /// longest text first.
    pub special_cache: Vec<u32>,
    /// Finds which of `special_cache` occur in a text at all (pattern i = `special_cache[i]`),
    /// so that partitioning only scans for those; `None` if there are no special tokens.
    pub special_matcher: Option<aho_corasick::AhoCorasick>,
}

fn bad(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::BadMetadata { key: key.to_string(), reason: reason.into() }
}

fn opt_bool(g: &GgufFile, key: &str) -> Option<bool> {
    g.get(key).and_then(Value::as_bool)
}

impl Vocab {
    pub fn load(g: &GgufFile) -> Result<Vocab, TokenizerError> {
        let model_name = g.get_str("tokenizer.ggml.model")?;
        let pre_name = g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("");

        let tokens = g.get_array("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let mut texts = Vec::with_capacity(n);
        let mut to_id = HashMap::with_capacity(n);
        for (i, v) in tokens.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| bad("tokenizer.ggml.tokens", format!("element {i} is not a string")))?;
            // llama.cpp renames empty tokens so that every text is unique and non-empty.
            let s = if s.is_empty() { format!("[EMPTY_{i}]") } else { s.to_string() };
            if let Some(prev) = to_id.insert(s.clone(), i as u32) {
                return Err(bad("tokenizer.ggml.tokens", format!("duplicate token {s:?} at ids {prev} and {i}")));
            }
            texts.push(s);
        }

        let scores = match g.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(Value::Array(a)) if a.len() >= n => a
                .iter()
                .take(n)
                .map(|v| match v {
                    Value::F32(x) => Ok(*x),
                    Value::I32(x) => Ok(*x as f32),
                    _ => Err(bad("tokenizer.ggml.scores", "elements must be f32 or i32")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(bad("tokenizer.ggml.scores", format!("must be an array of at least {n} numbers")));
            }
        };
        let mut attrs = match g.get("tokenizer.ggml.token_type") {
            None => vec![attr::NORMAL; n],
            Some(Value::Array(a)) if a.len() >= n => a
                .iter()
                .take(n)
                .map(|v| match v {
                    Value::I32(t) => Ok(attr_of_type(*t as i64)),
                    _ => Err(bad("tokenizer.ggml.token_type", "elements must be i32")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(bad("tokenizer.ggml.token_type", format!("must be an i32 array of at least {n}")));
            }
        };

        // Per-model defaults (llama.cpp `llama_vocab::impl::load`).
        let mut sp = Specials::default();
        let mut add_eos = false;
        let (model, mut add_bos, mut add_space_prefix, clean_spaces, ignore_merges) = match model_name {
            "llama" => {
                (sp.bos, sp.eos, sp.unk) = (Some(1), Some(2), Some(0));
                (Model::Spm, true, true, false, false)
            }
            "gpt2" => {
                (sp.bos, sp.eos) = (Some(11), Some(11));
                let info = PreTokenizer::from_name(pre_name)
                    .ok_or_else(|| TokenizerError::Unsupported(format!("pre-tokenizer {pre_name:?}")))?;
                let model = Model::Bpe { pre: info.pre, ranks: load_merges(g)? };
                (model, info.add_bos, false, info.clean_spaces, info.ignore_merges)
            }
            other => {
                return Err(TokenizerError::Unsupported(format!("tokenizer model {other:?}")));
            }
        };
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_space_prefix") {
            add_space_prefix = b;
        }

        // Default ids out of range are dropped; ids from the file override them when valid.
        for id in [&mut sp.bos, &mut sp.eos, &mut sp.unk] {
            if id.is_some_and(|v| v as usize >= n) {
                *id = None;
            }
        }
        type Slot = fn(&mut Specials) -> &mut Option<u32>;
        let keyed: [(&str, Slot); 17] = [
            ("bos_token_id", |s| &mut s.bos),
            ("eos_token_id", |s| &mut s.eos),
            ("eot_token_id", |s| &mut s.eot),
            ("eom_token_id", |s| &mut s.eom),
            ("unknown_token_id", |s| &mut s.unk),
            ("seperator_token_id", |s| &mut s.sep), // sic, as llama.cpp spells the key
            ("padding_token_id", |s| &mut s.pad),
            ("mask_token_id", |s| &mut s.mask),
            ("fim_pre_token_id", |s| &mut s.fim_pre),
            ("fim_suf_token_id", |s| &mut s.fim_suf),
            ("fim_mid_token_id", |s| &mut s.fim_mid),
            ("fim_pad_token_id", |s| &mut s.fim_pad),
            ("fim_rep_token_id", |s| &mut s.fim_rep),
            ("fim_sep_token_id", |s| &mut s.fim_sep),
            ("prefix_token_id", |s| &mut s.fim_pre),
            ("suffix_token_id", |s| &mut s.fim_suf),
            ("middle_token_id", |s| &mut s.fim_mid),
        ];
        // An id the file states must name a token: llama.cpp warns and keeps its default (a
        // BOS of 999999 quietly became token 1), which runs the model on the wrong prompt.
        for (key, slot) in keyed {
            let key = format!("tokenizer.ggml.{key}");
            let Some(v) = g.get(&key) else { continue };
            let id = v.as_u32().ok_or_else(|| match v.as_int() {
                Some(i) => bad(&key, format!("token id {i} is out of range (the vocabulary has {n} tokens)")),
                None => bad(&key, format!("must be a token id (an unsigned integer), not a {}", v.type_name())),
            })?;
            if id as usize >= n {
                return Err(bad(&key, format!("token id {id} is out of range (the vocabulary has {n} tokens)")));
            }
            *slot(&mut sp) = Some(id);
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_bos_token") {
            add_bos = b;
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_eos_token") {
            add_eos = b;
        }
        if add_bos && sp.bos.is_none() {
            return Err(bad("tokenizer.ggml.add_bos_token", "is true but there is no BOS token"));
        }
        if add_eos && sp.eos.is_none() {
            return Err(bad("tokenizer.ggml.add_eos_token", "is true but there is no EOS token"));
        }

        let eog = detect_by_text(&texts, &mut attrs, &mut sp);
        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        // Longest first so that e.g. "<end_of_turn>" wins over a shorter token inside it.
        special_cache.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()).then(a.cmp(&b)));

        let special_matcher = if special_cache.is_empty() {
            None
        } else {
            let pats = special_cache.iter().map(|&i| texts[i as usize].as_str());
            // Building can only fail on absurd automaton sizes; partitioning then scans for
            // every special token instead, which gives the same result, only slower.
            aho_corasick::AhoCorasick::new(pats).ok()
        };

        Ok(Vocab {
            model,
            texts,
            scores,
            attrs,
            to_id,
            sp,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            eog,
            special_cache,
            special_matcher,
        })
    }

    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    pub fn text_to_token(&self, s: &str) -> Option<u32> {
        self.to_id.get(s).copied()
    }
}

/// `tokenizer.ggml.merges`: "left right" strings; rank = index, first occurrence wins.
fn load_merges(g: &GgufFile) -> Result<HashMap<(String, String), u32>, TokenizerError> {
    let merges = g.get_array("tokenizer.ggml.merges")?;
    let mut ranks = HashMap::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let s = m.as_str().ok_or_else(|| bad("tokenizer.ggml.merges", format!("element {i} is not a string")))?;
        // Split at the first space after the first byte (a merge part may itself be " ").
        // (Byte index 1 may fall inside a multi-byte character such as "Ġ"; ' ' is ASCII, so
        // the position found is always a character boundary.)
        let (a, b) = match s.bytes().skip(1).position(|c| c == b' ') {
            Some(p) => (s[..p + 1].to_string(), s[p + 2..].to_string()),
            None => (String::new(), String::new()),
        };
        ranks.entry((a, b)).or_insert(i as u32);
    }
    Ok(ranks)
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP: &[&str] = &["<|file_sep|>"];
/// Texts llama.cpp treats as end-of-generation whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// llama.cpp's text-based detection of EOT/EOM/FIM tokens, "unused" control tokens and the
/// end-of-generation set. Tokens recognised this way become CONTROL.
fn detect_by_text(texts: &[String], attrs: &mut [u32], sp: &mut Specials) -> BTreeSet<u32> {
    for (i, t) in texts.iter().enumerate() {
        let id = i as u32;
        let t = t.as_str();
        let roles: [(&mut Option<u32>, &[&str]); 8] = [
            (&mut sp.eot, EOT_TEXTS),
            (&mut sp.eom, &["<|eom_id|>"]),
            (&mut sp.fim_pre, FIM_PRE),
            (&mut sp.fim_suf, FIM_SUF),
            (&mut sp.fim_mid, FIM_MID),
            (&mut sp.fim_pad, FIM_PAD),
            (&mut sp.fim_rep, FIM_REP),
            (&mut sp.fim_sep, FIM_SEP),
        ];
        for (slot, names) in roles {
            if slot.is_none() && names.contains(&t) {
                *slot = Some(id);
                attrs[i] |= attr::CONTROL;
            }
        }
    }
    for (i, t) in texts.iter().enumerate() {
        if attrs[i] & attr::CONTROL != 0 && t.contains("unused") {
            attrs[i] |= attr::UNUSED;
        }
    }
    let mut eog = BTreeSet::new();
    eog.extend(sp.fim_pad);
    eog.extend(sp.fim_rep);
    eog.extend(sp.fim_sep);
    for (i, t) in texts.iter().enumerate() {
        if EOG_TEXTS.contains(&t.as_str()) {
            eog.insert(i as u32);
            attrs[i] |= attr::CONTROL;
        }
    }
    eog.extend(sp.eos);
    eog.extend(sp.eot);
    eog.extend(sp.eom);
    let find = |eog: &BTreeSet<u32>, name: &str| eog.iter().copied().find(|&i| texts[i as usize] == name);
    // gpt-oss / solar-open: "<|end|>" ends a message, not the generation.
    let has = |eog: &BTreeSet<u32>, name: &str| find(eog, name).is_some();
    if let Some(end) = find(&eog, "<|end|>")
        && ((has(&eog, "<|return|>") && has(&eog, "<|call|>")) || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>")))
    {
        eog.remove(&end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
    // gemma4 / paddleocr: "</s>" is not an end of generation when "<|tool_response>" exists.
    if let (Some(_), Some(s)) = (find(&eog, "<|tool_response>"), find(&eog, "</s>")) {
        eog.remove(&s);
        attrs[s as usize] = attr::NORMAL;
    }
    // gpt-oss: these are always rendered.
    for (i, t) in texts.iter().enumerate() {
        if matches!(t.as_str(), "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>") {
            attrs[i] = attr::USER_DEFINED;
        }
    }
    eog
}
