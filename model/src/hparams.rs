//! Hyperparameters shared by the decoder architectures, read from `<arch>.*` GGUF keys.
//!
//! Each architecture file builds an [`HParams`] with [`Keys`], documenting its defaults where
//! llama.cpp has them; the forward pass only reads this struct.

use crate::error::{EngineError, Result};
use gguf::GgufFile;

/// Rotary embedding flavour: which pairs of a head are rotated together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Pairs (i, i + rot_dim/2): GPT-NeoX, Gemma, Qwen.
    Neox,
    /// Adjacent pairs (2i, 2i + 1): LLaMA (its GGUF Q/K rows are permuted for this).
    Norm,
}

/// FFN gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Silu,
    GeluTanh,
}

/// What one layer does; the cache kind follows from it (see `kv_cache::LayerCache`).
#[derive(Clone, Debug, PartialEq)]
pub enum LayerKind {
    /// Softmax attention with optional sliding window and its own rope parameters.
    Attention(AttnSpec),
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    /// A position attends to keys `pos - window + 1 ..= pos` (None: all previous positions).
    pub window: Option<usize>,
    pub rope_base: f32,
    pub rope_scale: f32,
}

/// Mixture-of-experts FFN shape, for every architecture with routed experts:
///
/// ```text
/// p = softmax(W_router x);  S = top-k experts by p (ties: the lower id);  w_e = p_e, or
/// p_e / max(Σ_S p, 6.1e-5) with norm_weights
/// y = Σ_{e∈S} w_e · down_e(silu(gate_e x) ⊙ up_e x)  [+ σ(w_sh·x) · down_sh(silu(gate_sh x) ⊙ up_sh x)]
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    /// Renormalise the selected experts' softmax weights to sum to 1.
    pub norm_weights: bool,
    /// An expert every token runs besides its routed ones (qwen4exp), added scaled by its
    /// sigmoid gate `σ(w_sh·x)`.
    pub shared_expert: Option<SharedExpertSpec>,
}

/// The always-on shared expert of an MoE FFN: a SwiGLU of width `n_ff` whose output is scaled
/// by `σ(ffn_gate_inp_shexp · x)` (the only shared-expert gate GGUF architectures use).
#[derive(Clone, Debug, PartialEq)]
pub struct SharedExpertSpec {
    pub n_ff: usize,
}

/// ggml clamps the renormalisation denominator of [`MoeSpec::norm_weights`] to the smallest
/// normal f16.
pub const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: super::Arch,
    pub n_layer: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    /// Dense FFN width (unused by MoE layers).
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope: RopeKind,
    pub rope_dim: usize,
    pub act: Act,
    /// Q is multiplied by this after rope (Gemma's query_pre_attn_scalar); 1 elsewhere.
    pub q_scale: f32,
    /// Scale applied to Q.K inside the softmax (1/sqrt(head_dim) for most models).
    pub kq_scale: f32,
    /// Input embeddings are multiplied by this (sqrt(n_embd) for Gemma).
    pub embd_scale: Option<f32>,
    pub qk_norm: bool,
    pub qkv_bias: bool,
    /// Gemma's extra norms after attention and after the FFN.
    pub post_norms: bool,
    pub moe: Option<MoeSpec>,
    pub layers: Vec<LayerKind>,
}

/// An RMS-norm epsilon a forward pass can use: finite, in (0, 1). NaN made every logit NaN;
/// a negative one can take the square root of a negative number.
pub fn check_rms_eps(v: f32) -> std::result::Result<f32, String> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not a usable RMS norm epsilon (a finite number in (0, 1), e.g. 1e-6)"))
    }
}

/// A rope frequency base: finite and > 1 (the frequencies base^(-2i/d) then lie in (1/base, 1]);
/// NaN, 0 or a negative base turns every rotation angle into NaN or infinity.
pub fn check_rope_base(v: f32) -> std::result::Result<f32, String> {
    if v.is_finite() && v > 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not a usable rope frequency base (a finite number > 1, e.g. 10000)"))
    }
}

/// A small float tensor (norm weights, biases, scales) read at load must hold finite values:
/// one NaN in `output_norm.weight` changed every greedy token with no error (issue 39).
pub fn check_finite(name: &str, values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(EngineError::NonFiniteWeight { name: name.into(), index, value: values[index] }),
    }
}

/// How many layer blocks the file's tensors describe: one past the highest `blk.N.` index
/// (0 when there is none).
pub fn blocks_in_file(g: &GgufFile) -> usize {
    g.tensors().iter().filter_map(gguf::TensorInfo::block).max().map_or(0, |m| m + 1)
}

/// A layer count read from metadata must not exceed the layers the file holds tensors for:
/// per-layer tables are sized from it before any tensor is looked up, and a `block_count` of
/// 2^32-1 aborted the process with a 100 GB allocation (issue 39).
pub fn check_layer_count(g: &GgufFile, key: &str, n_layer: usize) -> Result<()> {
    let held = blocks_in_file(g);
    if n_layer > held {
        return Err(EngineError::BadMetadata {
            key: key.to_string(),
            why: format!(
                "{n_layer} layers, but the file's tensors describe {held} (blk.0 .. blk.{})",
                held.saturating_sub(1)
            ),
        });
    }
    Ok(())
}

/// Typed access to `<arch>.<name>` keys with errors naming the key. Floats must be finite.
pub struct Keys<'a> {
    pub g: &'a GgufFile,
    pub arch: super::Arch,
}

impl<'a> Keys<'a> {
    fn key(&self, name: &str) -> String {
        format!("{}.{}", self.arch, name)
    }
    pub fn has(&self, name: &str) -> bool {
        self.g.get(&self.key(name)).is_some()
    }
    /// A GGUF error (missing key, wrong type) as it is: it names the file and the key.
    fn gguf_err(&self, source: gguf::GgufError) -> EngineError {
        let path = self.g.paths().first().map(|p| p.to_path_buf()).unwrap_or_default();
        EngineError::Gguf { path, source }
    }
    pub fn u32(&self, name: &str) -> Result<usize> {
        self.g.get_u32(&self.key(name)).map(|v| v as usize).map_err(|e| self.gguf_err(e))
    }
    pub fn u32_or(&self, name: &str, default: usize) -> Result<usize> {
        if self.has(name) { self.u32(name) } else { Ok(default) }
    }
    pub fn f32(&self, name: &str) -> Result<f32> {
        let k = self.key(name);
        let v = self.g.get_f32(&k).map_err(|e| self.gguf_err(e))?;
        if !v.is_finite() {
            return Err(EngineError::BadMetadata { key: k, why: format!("{v} is not a finite number") });
        }
        Ok(v)
    }
    /// [`Keys::f32_or`], then `check` (a range check returning why the value is unusable).
    pub fn f32_checked(
        &self,
        name: &str,
        default: f32,
        check: fn(f32) -> std::result::Result<f32, String>,
    ) -> Result<f32> {
        let v = self.f32_or(name, default)?;
        check(v).map_err(|why| EngineError::BadMetadata { key: self.key(name), why })
    }
    pub fn f32_or(&self, name: &str, default: f32) -> Result<f32> {
        if self.has(name) { self.f32(name) } else { Ok(default) }
    }
    pub fn bool_or(&self, name: &str, default: bool) -> bool {
        match self.g.get(&self.key(name)) {
            Some(gguf::Value::Bool(b)) => *b,
            _ => default,
        }
    }
    /// Linear rope scaling: `rope.scaling.factor` f (freq_scale = 1/f) when the type is linear.
    pub fn rope_freq_scale(&self) -> Result<f32> {
        let ty = self.g.get(&self.key("rope.scaling.type"));
        let linear = matches!(ty, Some(gguf::Value::Str(s)) if s == "linear");
        let factor = self.f32_checked("rope.scaling.factor", 0.0, |f| {
            if f >= 0.0 { Ok(f) } else { Err(format!("{f} is negative (0 = no scaling)")) }
        })?;
        // llama.cpp: freq_scale = 1/factor when a factor is given (0 = none).
        Ok(if factor > 0.0 && (linear || ty.is_none()) { 1.0 / factor } else { 1.0 })
    }

    /// The block count, embedding width, head layout and eps every architecture has.
    pub fn common(&self) -> Result<CommonKeys> {
        let n_layer = self.u32("block_count")?;
        let n_embd = self.u32("embedding_length")?;
        let n_head = self.u32("attention.head_count")?;
        if n_head == 0 || n_layer == 0 || n_embd == 0 {
            return Err(EngineError::BadMetadata {
                key: self.key("attention.head_count"),
                why: "block_count, embedding_length and head_count must be > 0".into(),
            });
        }
        check_layer_count(self.g, &self.key("block_count"), n_layer)?;
        // Defaults as in llama.cpp: n_head_kv = n_head, head_dim = n_embd / n_head.
        let n_head_kv = self.u32_or("attention.head_count_kv", n_head)?;
        let head_dim = self.u32_or("attention.key_length", n_embd / n_head)?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(EngineError::BadMetadata {
                key: self.key("attention.head_count_kv"),
                why: format!("{n_head_kv} does not divide head_count {n_head}"),
            });
        }
        let bad = |name: &str, why: String| EngineError::BadMetadata { key: self.key(name), why };
        // Rope rotates pairs of a head, so the rotated part is even, > 0 and within the head.
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad("attention.key_length", format!("head dim {head_dim} must be even and > 0")));
        }
        let rope_dim = self.u32_or("rope.dimension_count", head_dim)?;
        if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(bad(
                "rope.dimension_count",
                format!("{rope_dim} must be even, > 0 and <= the head dim {head_dim}"),
            ));
        }
        let n_ctx_train = self.u32_or("context_length", 4096)?;
        if n_ctx_train == 0 {
            return Err(bad("context_length", "0 positions: must be > 0".into()));
        }
        Ok(CommonKeys {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            // Not every model stores the training context; 4096 only sizes the default cache.
            n_ctx_train,
            n_ff: self.u32_or("feed_forward_length", 0)?,
            rms_eps: self.f32_checked("attention.layer_norm_rms_epsilon", 1e-6, check_rms_eps)?,
            // llama.cpp silently defaults a missing freq_base to 10000.
            rope_base: self.f32_checked("rope.freq_base", 10000.0, check_rope_base)?,
            rope_dim,
        })
    }
}

pub struct CommonKeys {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ctx_train: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_dim: usize,
}
