//! The MTP (multi-token prediction, "NextN") draft head of a qwen4exp model, after llama.cpp's
//! NextN convention (DeepSeek-V3, GLM-4.5, Qwen3-Next): one extra block `blk.{N}` stored after
//! the `N` trunk layers, in its own GGUF or in the model file itself.
//!
//! For position p it reads the trunk's final hidden state `h_p` (the head mixer's output that
//! the output matrix multiplies; this model has no output norm) and the embedding of the token
//! `t_{p+1}` that followed, and predicts `t_{p+2}`:
//!
//! ```text
//! x  = W_eh · [rms(emb(t_{p+1}); enorm) ‖ rms(h_p; hnorm)]        eh_proj: [2E → E]
//! x += Attn(rms(x; attn_norm))     gated GQA attention (QSA code), own KV cache, position p
//! x += MoE(rms(x; post_attention_norm))           router, experts, sigmoid-gated shared expert
//! h' = x                                           (fed back as h when the head chains itself)
//! logits = W_head · rms(x; shared_head_norm)       W_head = shared_head_head, else output.weight
//! ```
//! `emb` is `nextn.embed_tokens` when present, else the model's `token_embd`. The block is a
//! plain pre-norm residual block (no hyper-connection streams): its attention and MoE weights
//! use the trunk's names and shapes (`blk.{N}.attn_*`, `blk.{N}.ffn_*`), so the same modules
//! run it. The attention is dense unless `attention.compress_ratios[N] > 0` (then the block
//! indexer runs too, with `blk.{N}.indexer.*`).
//!
//! The file must agree with the model: architecture `qwen4exp`, `nextn_predict_layers ≥ 1`
//! (the first NextN block is used), `block_count − nextn_predict_layers` = the model's trunk
//! layers, the same embedding width, and every attention / expert key it carries equal to the
//! model's; tensor shapes are checked against the model's dimensions. Errors name the file and
//! the key or tensor.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgufFile, Value};

use super::linear::{Mat, rms_norm};
use super::load::{Loader, attention, moe};
use super::moe::Moe;
use super::qsa::{Qsa, QsaCache};
use super::{KvType, Qwen4Exp, Qwen4ExpError};

/// A loaded MTP head (weights reference the memory-mapped GGUF).
pub struct Mtp {
    /// The GGUF file it was read from.
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    /// Block index N (= the model's trunk layers).
    pub block: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub eps: f32,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// `[E][2E]`: columns `0..E` take the normed embedding, `E..2E` the normed hidden state.
    pub eh_proj: Mat,
    pub attn_norm: Vec<f32>,
    pub attn: Qsa,
    pub ffn_norm: Vec<f32>,
    pub moe: Moe,
    pub head_norm: Vec<f32>,
    /// `nextn.embed_tokens` (`None`: the model's `token_embd`).
    pub embed: Option<Mat>,
    /// `nextn.shared_head_head` (`None`: the model's output matrix).
    pub head: Option<Mat>,
}

impl std::fmt::Debug for Mtp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mtp(blk.{} of {:?}, {} attention, own embed {}, own head {})",
            self.block,
            self.path,
            if self.attn.indexer.is_some() {
                "sparse"
            } else {
                "dense"
            },
            self.embed.is_some(),
            self.head.is_some()
        )
    }
}

/// The MTP block's sequence state: its attention cache, one cell per position.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpState {
    pub cache: QsaCache,
}

/// Output of [`Mtp::forward`].
#[derive(Clone, Debug, PartialEq)]
pub struct MtpOut {
    /// `[rows][n_vocab]`: every position, or only the last one.
    pub logits: Vec<f32>,
    /// `[n][n_embd]` block outputs `h'` (before `shared_head_norm`), for chaining.
    pub hidden: Vec<f32>,
}

fn in_file(path: &Path, source: Qwen4ExpError) -> Qwen4ExpError {
    Qwen4ExpError::Mtp {
        path: path.to_path_buf(),
        source: Box::new(source),
    }
}

/// `--mtp PATH`: a GGUF file, or a directory holding exactly one `*.gguf` (or exactly one first
/// shard `*-00001-of-*.gguf`).
pub fn resolve_path(path: &Path) -> Result<PathBuf, Qwen4ExpError> {
    let file_err = |reason: String| Qwen4ExpError::MtpFile {
        path: path.to_path_buf(),
        reason,
    };
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
        let first: Vec<PathBuf> = ggufs
            .iter()
            .filter(|p| p.to_string_lossy().contains("-00001-of-"))
            .cloned()
            .collect();
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
            ggufs
                .iter()
                .filter_map(|p| p.file_name())
                .collect::<Vec<_>>()
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
        other => other
            .as_int()
            .map(|i| i.to_string())
            .unwrap_or_else(|| format!("{other:?}")),
    })
}

/// A key the MTP file may carry: if present it must equal the model's value.
fn same_u32(g: &GgufFile, k: &str, model: usize) -> Result<(), Qwen4ExpError> {
    let Some(v) = g.get(&key(k)) else {
        return Ok(());
    };
    match v.as_u64() {
        Some(x) if x == model as u64 => Ok(()),
        _ => Err(Qwen4ExpError::MtpMismatch {
            key: key(k),
            mtp: show(g, k).unwrap_or_default(),
            model: model.to_string(),
        }),
    }
}

fn same_f32(g: &GgufFile, k: &str, model: f32) -> Result<(), Qwen4ExpError> {
    let Some(v) = g.get(&key(k)) else {
        return Ok(());
    };
    match v.as_f32() {
        Some(x) if x.to_bits() == model.to_bits() => Ok(()),
        _ => Err(Qwen4ExpError::MtpMismatch {
            key: key(k),
            mtp: show(g, k).unwrap_or_default(),
            model: format!("{model:e}"),
        }),
    }
}

impl Mtp {
    /// Opens the MTP head at `path` (a GGUF file or a directory holding one) for `model`.
    /// The path may also be the model file itself when it stores the NextN block.
    pub fn open(model: &Qwen4Exp, path: &Path) -> Result<Mtp, Qwen4ExpError> {
        let file = resolve_path(path)?;
        let g = GgufFile::open(&file).map_err(|e| in_file(&file, e.into()))?;
        Self::from_gguf(model, g, &file)
    }

    /// [`Mtp::open`] on an already opened file (`path` is used in errors).
    pub fn from_gguf(model: &Qwen4Exp, g: GgufFile, path: &Path) -> Result<Mtp, Qwen4ExpError> {
        Self::load(model, Arc::new(g), path).map_err(|e| in_file(path, e))
    }

    fn load(m: &Qwen4Exp, g: Arc<GgufFile>, path: &Path) -> Result<Mtp, Qwen4ExpError> {
        let arch = g.architecture()?;
        if arch != "qwen4exp" {
            return Err(Qwen4ExpError::WrongArchitecture(arch.to_string()));
        }
        let hp = &m.hp;
        let nextn = match g.get(&key("nextn_predict_layers")) {
            None => {
                return Err(Qwen4ExpError::MissingKey {
                    key: key("nextn_predict_layers"),
                });
            }
            Some(_) => g.get_u32(&key("nextn_predict_layers"))? as usize,
        };
        if nextn == 0 {
            return Err(Qwen4ExpError::BadKey {
                key: key("nextn_predict_layers"),
                reason: "0: the file has no NextN (MTP) block".into(),
            });
        }
        let blocks = g.get_u32(&key("block_count"))? as usize;
        if blocks != hp.n_layer + nextn {
            return Err(Qwen4ExpError::MtpMismatch {
                key: key("block_count"),
                mtp: format!("{blocks} ({nextn} NextN)"),
                model: format!("{} trunk layers + {nextn}", hp.n_layer),
            });
        }
        let e = g.get_u32(&key("embedding_length"))? as usize;
        if e != hp.n_embd {
            return Err(Qwen4ExpError::MtpMismatch {
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
            return Err(Qwen4ExpError::MtpMismatch {
                key: "tokenizer.ggml.tokens".into(),
                mtp: format!("{} tokens", toks.len()),
                model: format!("{} tokens", hp.n_vocab),
            });
        }
        let n = hp.n_layer;
        // The NextN block must be an attention block; its ratio picks dense or sparse.
        let entry = |k: &str| -> Option<Value> {
            g.get(&key(k))
                .and_then(Value::as_array)
                .and_then(|a| a.get(n).cloned())
        };
        if let Some(v) = entry("attention.recurrent_layers")
            && v.as_bool().or_else(|| v.as_u32().map(|u| u != 0)) == Some(true)
        {
            return Err(Qwen4ExpError::BadKey {
                key: key("attention.recurrent_layers"),
                reason: format!("block {n} (the NextN block) is recurrent; it must be attention"),
            });
        }
        let ratio = match entry("attention.compress_ratios") {
            None => 0,
            Some(v) => v.as_u32().ok_or_else(|| Qwen4ExpError::BadKey {
                key: key("attention.compress_ratios"),
                reason: format!("entry {n} is not an integer"),
            })? as usize,
        };
        if ratio > 64 {
            return Err(Qwen4ExpError::BadKey {
                key: key("attention.compress_ratios"),
                reason: format!("block {n}: ratio {ratio} > 64"),
            });
        }

        let l = Loader::new(g.clone());
        let v = hp.n_vocab;
        let p = |s: &str| format!("blk.{n}.{s}");
        let nx = |s: &str| format!("blk.{n}.nextn.{s}");
        let opt_mat = |name: String| -> Result<Option<Mat>, Qwen4ExpError> {
            if l.has(&name) {
                l.mat(&name, e, v).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Mtp {
            path: path.to_path_buf(),
            file: g.clone(),
            block: n,
            n_embd: e,
            n_vocab: v,
            eps: hp.eps,
            eh_proj: l.mat(&nx("eh_proj.weight"), 2 * e, e)?,
            enorm: l.vec(&nx("enorm.weight"), &[e])?,
            hnorm: l.vec(&nx("hnorm.weight"), &[e])?,
            attn_norm: l.vec(&p("attn_norm.weight"), &[e])?,
            attn: attention(&l, hp, n, ratio)?,
            ffn_norm: l.vec(&p("post_attention_norm.weight"), &[e])?,
            moe: moe(&l, hp, n)?,
            head_norm: l.vec(&nx("shared_head_norm.weight"), &[e])?,
            embed: opt_mat(nx("embed_tokens.weight"))?,
            head: opt_mat(nx("shared_head_head.weight"))?,
        })
    }

    /// An empty state (`kv` as the model's: F16 rounds K/V, q and probabilities like llama.cpp).
    pub fn new_state(&self, kv: KvType) -> MtpState {
        MtpState {
            cache: QsaCache::new(kv == KvType::F16),
        }
    }

    /// Positions held by `st` (the position of the next pair).
    pub fn cells(&self, st: &MtpState) -> usize {
        self.attn.cells(&st.cache)
    }

    /// Drops every cell from `cells` on (speculative rollback); the result equals a state
    /// that never saw them.
    pub fn truncate(&self, st: &mut MtpState, cells: usize) {
        let cur = self.cells(st);
        let block = self.attn.indexer.as_ref().map(|ix| (ix.ratio, ix.dim));
        st.cache.truncate(cells, cur, block);
    }

    /// Runs the pairs `(tokens[i], hidden[i])` at positions `cells(st)..` (`hidden [n][E]`:
    /// the trunk's final hidden state of the position before each token, or the head's own
    /// `h'` when chaining). Logits for every pair (`all_logits`) or only the last.
    pub fn forward(
        &self,
        model: &Qwen4Exp,
        st: &mut MtpState,
        tokens: &[u32],
        hidden: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut, Qwen4ExpError> {
        let (n, e, v) = (tokens.len(), self.n_embd, self.n_vocab);
        let hp = &model.hp;
        if (hp.n_embd, hp.n_vocab, hp.n_layer) != (e, v, self.block) {
            return Err(Qwen4ExpError::MtpMismatch {
                key: "model (embedding, vocabulary, trunk layers)".into(),
                mtp: format!("({e}, {v}, {})", self.block),
                model: format!("({}, {}, {})", hp.n_embd, hp.n_vocab, hp.n_layer),
            });
        }
        if let Some((index, &token)) = tokens.iter().enumerate().find(|(_, t)| **t as usize >= v) {
            return Err(Qwen4ExpError::Token {
                token,
                index,
                n_vocab: v,
            });
        }
        if hidden.len() != n * e {
            return Err(Qwen4ExpError::MtpInput {
                got: hidden.len(),
                tokens: n,
                width: e,
            });
        }
        if n == 0 {
            return Ok(MtpOut {
                logits: Vec::new(),
                hidden: Vec::new(),
            });
        }
        let embed = self.embed.as_ref().unwrap_or(&model.tok_embd);
        let mut cat = vec![0f32; n * 2 * e];
        let mut emb = vec![0f32; e];
        for t in 0..n {
            embed.get_row(tokens[t] as usize, &mut emb);
            let row = &mut cat[t * 2 * e..(t + 1) * 2 * e];
            rms_norm(&emb, Some(&self.enorm), self.eps, &mut row[..e]);
            rms_norm(
                &hidden[t * e..(t + 1) * e],
                Some(&self.hnorm),
                self.eps,
                &mut row[e..],
            );
        }
        let mut x = vec![0f32; n * e];
        self.eh_proj.matmul(&cat, n, &mut x);
        let mut u = vec![0f32; n * e];
        let mut y = vec![0f32; n * e];
        let norm_rows = |x: &[f32], gamma: &[f32], u: &mut [f32]| {
            for t in 0..n {
                rms_norm(
                    &x[t * e..(t + 1) * e],
                    Some(gamma),
                    self.eps,
                    &mut u[t * e..(t + 1) * e],
                );
            }
        };
        norm_rows(&x, &self.attn_norm, &mut u);
        let start = self.cells(st);
        self.attn
            .forward(&u, n, start, &mut st.cache, &mut y, false);
        x.iter_mut().zip(&y).for_each(|(a, &b)| *a += b);
        norm_rows(&x, &self.ffn_norm, &mut u);
        self.moe.forward(&u, n, &mut y);
        x.iter_mut().zip(&y).for_each(|(a, &b)| *a += b);

        let head = self.head.as_ref().unwrap_or(&model.output);
        let first = if all_logits { 0 } else { n - 1 };
        let rows = n - first;
        let mut z = vec![0f32; rows * e];
        for (i, t) in (first..n).enumerate() {
            rms_norm(
                &x[t * e..(t + 1) * e],
                Some(&self.head_norm),
                self.eps,
                &mut z[i * e..(i + 1) * e],
            );
        }
        let mut logits = vec![0f32; rows * v];
        head.matmul(&z, rows, &mut logits);
        Ok(MtpOut { logits, hidden: x })
    }
}
