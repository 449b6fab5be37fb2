//! The MTP (multi-token prediction, "NextN") draft head of a qwen4exp model in the layout of
//! the published Flash-Next MTP GGUFs (llama.cpp's `qwen4exp` loader): one extra block
//! `blk.{N}` after the `N` trunk layers, in its own GGUF or in the model file itself.
//!
//! For position p it reads the trunk's **wide residual** `R_p` (all `hc` hyper-connection
//! streams, before the output mixer) and the token `t_{p+1}` that followed, and predicts
//! `t_{p+2}`:
//!
//! ```text
//! e    = rms(emb(t_{p+1}); enorm)                                   [E]
//! R[c] = W_eh · [e ‖ rms(R_p[c]; hnorm[c])]      per stream c, eh_proj [2E → E], shared
//! x, inj = HCmix_attn(R); y = Attn(x); R = HCcombine(R, y, inj)   dense gated GQA, own cache
//! x, inj = HCmix_ffn(R);  y = MoE(x);  R = HCcombine(R, y, inj)   experts + shared expert
//! logits = W_out · HCmix_head(R)                 hc_head mixer (no inject), trunk's W_out
//! R' = R                                         (fed back as R_p when the head chains itself)
//! ```
//! The GR read/write is the trunk's ([`HyperConn`]); there is no attention / FFN / head norm
//! beyond the mixers' per-stream norms, as in the trunk. `hc_head_*` absent (all three) means
//! the trunk's `output_hc_*` mixer. The `indexer.*` tensors of the published files are
//! shape-checked and not used: the implementations that load these files attend densely.
//! `emb` / `W_out` are `nextn.embed_tokens` / `nextn.shared_head_head` when present (the
//! NextN convention of other models; the Flash-Next files carry neither).
//!
//! The file must agree with the model: architecture `qwen4exp`, `nextn_predict_layers ≥ 1`
//! (the first NextN block is used), `block_count − nextn_predict_layers` = the model's trunk
//! layers, the same embedding width and hyper-connection shape, and every attention / expert
//! key it carries equal to the model's; every tensor's ggml shape is checked against the
//! model's dimensions. Errors name the file, the key or tensor, and the expected shape.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgufFile, Value};

use super::gr::HyperConn;
use super::load::{Loader, attention, moe};
use super::moe::Moe;
use super::qsa::{Qsa, QsaCache};
use super::{KvType, Qwen4Exp};
use crate::Mat;
use crate::error::EngineError;

/// A loaded MTP head (weights reference the memory-mapped GGUF).
pub struct Mtp {
    /// The GGUF file it was read from.
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    /// Block index N (= the model's trunk layers).
    pub block: usize,
    pub n_embd: usize,
    /// Hyper-connection streams (the model's).
    pub hc: usize,
    pub n_vocab: usize,
    pub eps: f32,
    pub enorm: Vec<f32>,
    /// `[hc][E]`: one gamma row per stream of the wide residual.
    pub hnorm: Vec<f32>,
    /// `[E][2E]`: columns `0..E` take the normed embedding, `E..2E` one normed stream.
    pub eh_proj: Mat,
    pub hc_attn: HyperConn,
    /// Dense attention (the indexer is never built for the head).
    pub attn: Qsa,
    pub hc_ffn: HyperConn,
    pub moe: Moe,
    /// `nextn.hc_head_*` (`None`: the model's `output_hc_*`).
    pub hc_head: Option<HyperConn>,
    /// `nextn.embed_tokens` (`None`: the model's `token_embd`).
    pub embed: Option<Mat>,
    /// `nextn.shared_head_head` (`None`: the model's output matrix).
    pub head: Option<Mat>,
}

impl std::fmt::Debug for Mtp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mtp(blk.{} of {:?}, {} streams, own hc_head {}, own embed {}, own head {})",
            self.block,
            self.path,
            self.hc,
            self.hc_head.is_some(),
            self.embed.is_some(),
            self.head.is_some()
        )
    }
}

/// The MTP block's sequence state: its attention cache, one cell per position.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpState {
    pub cache: QsaCache,
    /// The float order the CPU runs the head in (as the trunk's `SeqState::numerics`).
    pub numerics: crate::loaded::Numerics,
}

/// Output of [`Mtp::forward`].
#[derive(Clone, Debug, PartialEq)]
pub struct MtpOut {
    /// `[rows][n_vocab]`: every position, or only the last one.
    pub logits: Vec<f32>,
    /// `[n][hc][n_embd]` wide residual after the block (before the head mixer), for chaining.
    pub hidden: Vec<f32>,
}

fn in_file(path: &Path, source: EngineError) -> EngineError {
    EngineError::Mtp { path: path.to_path_buf(), source: Box::new(source) }
}

/// `--mtp PATH`: a GGUF file, or a directory holding exactly one `*.gguf` (or exactly one first
/// shard `*-00001-of-*.gguf`).
pub fn resolve_path(path: &Path) -> Result<PathBuf, EngineError> {
    let file_err = |reason: String| EngineError::MtpFile { path: path.to_path_buf(), reason };
    if !path.is_dir() {
        if !path.exists() {
            return Err(file_err("not found".into()));
        }
        return Ok(path.to_path_buf());
    }
    let rd = std::fs::read_dir(path).map_err(|e| file_err(format!("cannot list: {e}")))?;
    let mut ggufs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    ggufs.sort();
    if ggufs.len() > 1 {
        let first: Vec<PathBuf> =
            ggufs.iter().filter(|p| p.to_string_lossy().contains("-00001-of-")).cloned().collect();
        if first.len() == 1 {
            return Ok(first[0].clone());
        }
    }
    match ggufs.len() {
        1 => Ok(ggufs.remove(0)),
        0 => Err(file_err("directory holds no *.gguf file".into())),
        _ => Err(file_err(format!(
            "directory holds {} GGUF files ({:?}); pass the MTP file itself",
            ggufs.len(),
            ggufs.iter().filter_map(|p| p.file_name()).collect::<Vec<_>>()
        ))),
    }
}

fn key(k: &str) -> String {
    format!("qwen4exp.{k}")
}

/// `value` of `qwen4exp.{k}` as text (`None` if absent).
fn show(g: &GgufFile, k: &str) -> Option<String> {
    g.get(&key(k)).map(|v| match v {
        Value::F32(x) => format!("{x:e}"),
        Value::F64(x) => format!("{x:e}"),
        other => other.as_int().map(|i| i.to_string()).unwrap_or_else(|| format!("{other:?}")),
    })
}

/// A key the MTP file may carry: if present it must equal the model's value.
fn same_u32(g: &GgufFile, k: &str, model: usize) -> Result<(), EngineError> {
    let Some(v) = g.get(&key(k)) else {
        return Ok(());
    };
    match v.as_u64() {
        Some(x) if x == model as u64 => Ok(()),
        _ => {
            Err(EngineError::MtpMismatch { key: key(k), mtp: show(g, k).unwrap_or_default(), model: model.to_string() })
        }
    }
}

fn same_f32(g: &GgufFile, k: &str, model: f32) -> Result<(), EngineError> {
    let Some(v) = g.get(&key(k)) else {
        return Ok(());
    };
    match v.as_f32() {
        Some(x) if x.to_bits() == model.to_bits() => Ok(()),
        _ => Err(EngineError::MtpMismatch {
            key: key(k),
            mtp: show(g, k).unwrap_or_default(),
            model: format!("{model:e}"),
        }),
    }
}

impl Mtp {
    /// Opens the MTP head at `path` (a GGUF file or a directory holding one) for `model`.
    /// The path may also be the model file itself when it stores the NextN block.
    pub fn open(model: &Qwen4Exp, path: &Path) -> Result<Mtp, EngineError> {
        let file = resolve_path(path)?;
        let g = GgufFile::open(&file).map_err(|e| in_file(&file, e.into()))?;
        Self::from_gguf(model, g, &file)
    }

    /// [`Mtp::open`] on an already opened file (`path` is used in errors).
    pub fn from_gguf(model: &Qwen4Exp, g: GgufFile, path: &Path) -> Result<Mtp, EngineError> {
        Self::load(model, Arc::new(g), path).map_err(|e| in_file(path, e))
    }

    fn load(m: &Qwen4Exp, g: Arc<GgufFile>, path: &Path) -> Result<Mtp, EngineError> {
        let arch = g.architecture()?;
        if arch != "qwen4exp" {
            return Err(EngineError::WrongArchitecture(arch.to_string()));
        }
        let hp = &m.hp;
        let nextn = match g.get(&key("nextn_predict_layers")) {
            None => {
                return Err(EngineError::MissingKey { key: key("nextn_predict_layers") });
            }
            Some(_) => g.get_u32(&key("nextn_predict_layers"))? as usize,
        };
        if nextn == 0 {
            return Err(EngineError::BadMetadata {
                key: key("nextn_predict_layers"),
                why: "0: the file has no NextN (MTP) block".into(),
            });
        }
        let blocks = g.get_u32(&key("block_count"))? as usize;
        if blocks != hp.n_layer + nextn {
            return Err(EngineError::MtpMismatch {
                key: key("block_count"),
                mtp: format!("{blocks} ({nextn} NextN)"),
                model: format!("{} trunk layers + {nextn}", hp.n_layer),
            });
        }
        let e = g.get_u32(&key("embedding_length"))? as usize;
        if e != hp.n_embd {
            return Err(EngineError::MtpMismatch {
                key: key("embedding_length"),
                mtp: e.to_string(),
                model: hp.n_embd.to_string(),
            });
        }
        for (k, v) in [
            ("attention.head_count", hp.n_head),
            ("attention.head_count_kv", hp.n_head_kv),
            ("attention.key_length", hp.head_dim),
            ("attention.value_length", hp.head_dim),
            ("rope.dimension_count", hp.n_rot),
            ("expert_count", hp.n_expert),
            ("expert_used_count", hp.n_expert_used),
            ("attention.indexer.head_count", hp.idx_heads),
            ("attention.indexer.key_length", hp.idx_dim),
            ("attention.indexer.top_k", hp.idx_top_k),
            ("hyper_connection.count", hp.hc),
            ("hyper_connection.low_rank", hp.hc_rank),
        ] {
            same_u32(&g, k, v)?;
        }
        if let Some(v) = hp.n_ff_exp {
            same_u32(&g, "expert_feed_forward_length", v)?;
        }
        if let Some(v) = hp.n_ff_shexp {
            same_u32(&g, "expert_shared_feed_forward_length", v)?;
        }
        same_f32(&g, "attention.layer_norm_rms_epsilon", hp.eps)?;
        same_f32(&g, "rope.freq_base", hp.rope_base)?;
        if let Some(Value::Array(toks)) = g.get("tokenizer.ggml.tokens")
            && toks.len() != hp.n_vocab
        {
            return Err(EngineError::MtpMismatch {
                key: "tokenizer.ggml.tokens".into(),
                mtp: format!("{} tokens", toks.len()),
                model: format!("{} tokens", hp.n_vocab),
            });
        }
        let n = hp.n_layer;
        // The NextN block must be an attention block (dense whatever its compress ratio).
        let entry =
            |k: &str| -> Option<Value> { g.get(&key(k)).and_then(Value::as_array).and_then(|a| a.get(n).cloned()) };
        if let Some(v) = entry("attention.recurrent_layers")
            && v.as_bool().or_else(|| v.as_u32().map(|u| u != 0)) == Some(true)
        {
            return Err(EngineError::BadMetadata {
                key: key("attention.recurrent_layers"),
                why: format!("block {n} (the NextN block) is recurrent; it must be attention"),
            });
        }
        let l = Loader::new(g.clone());
        let (v, hc, lr) = (hp.n_vocab, hp.hc, hp.hc_rank);
        let p = |s: &str| format!("blk.{n}.{s}");
        let nx = |s: &str| format!("blk.{n}.nextn.{s}");
        let opt_mat = |name: String| -> Result<Option<Mat>, EngineError> {
            if l.has(&name) { l.mat(&name, e, v).map(Some) } else { Ok(None) }
        };
        // The published files carry the indexer; the head attends densely, so only its shape
        // is checked (a wrong one means the file is not for this model).
        for (t, dims) in [
            ("indexer.q_proj.weight", vec![e, hp.idx_heads * hp.idx_dim]),
            ("indexer.k_proj.weight", vec![e, hp.idx_dim]),
            ("indexer.q_norm.weight", vec![hp.idx_dim]),
            ("indexer.k_norm.weight", vec![hp.idx_dim]),
        ] {
            if l.has(&p(t)) {
                l.check(&p(t), &dims)?;
            }
        }
        // The head's own output mixer: all three tensors, or none (then the trunk's).
        let head_names = ["norm", "down", "up"].map(|s| nx(&format!("hc_head_{s}.weight")));
        let hc_head = if head_names.iter().any(|t| l.has(t)) {
            Some(HyperConn {
                hc,
                n_embd: e,
                eps: hp.eps,
                norm: l.vec(&head_names[0], &[hc * e])?,
                down: l.mat(&head_names[1], hc * e, lr)?,
                up: l.mat(&head_names[2], lr, hc * e)?,
                inject: None,
            })
        } else {
            None
        };
        Ok(Mtp {
            path: path.to_path_buf(),
            file: g.clone(),
            block: n,
            n_embd: e,
            hc,
            n_vocab: v,
            eps: hp.eps,
            enorm: l.vec(&nx("enorm.weight"), &[e])?,
            hnorm: l.vec(&nx("hnorm.weight"), &[hc * e])?,
            eh_proj: l.mat(&nx("eh_proj.weight"), 2 * e, e)?,
            hc_attn: l.hc(&p("hc_attn_"), hp, true)?,
            attn: attention(&l, hp, n, 0)?,
            hc_ffn: l.hc(&p("hc_ffn_"), hp, true)?,
            moe: moe(&l, hp, n)?,
            hc_head,
            embed: opt_mat(nx("embed_tokens.weight"))?,
            head: opt_mat(nx("shared_head_head.weight"))?,
        })
    }

    /// Width of one position's input and output state: the `hc` streams of the residual.
    pub fn width(&self) -> usize {
        self.hc * self.n_embd
    }

    /// An empty state (`kv` as the model's: F16 rounds K/V, q and probabilities like llama.cpp).
    pub fn new_state(&self, kv: KvType) -> MtpState {
        MtpState { cache: self.attn.new_cache(kv), numerics: Default::default() }
    }

    /// Positions held by `st` (the position of the next pair).
    pub fn cells(&self, st: &MtpState) -> usize {
        self.attn.cells(&st.cache)
    }

    /// Drops every cell from `cells` on (speculative rollback); the result equals a state
    /// that never saw them.
    pub fn truncate(&self, st: &mut MtpState, cells: usize) {
        let cur = self.cells(st);
        st.cache.truncate(cells, cur, None);
    }
}
