//! Hyperparameters of a `qwen4exp` GGUF: every `qwen4exp.*` key the forward pass reads, with
//! llama.cpp's defaults (commented) and the loader constraints that llama.cpp enforces (or
//! aborts on) turned into typed errors.

use gguf::{GgufFile, Value};

use crate::error::EngineError;

const A: &str = "qwen4exp";

/// What a layer's token mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (recurrent).
    Gdn,
    /// Sparse attention with block ratio `r` (indexer top-k over cells).
    Qsa { ratio: usize },
    /// Dense causal attention (an attention layer with compress ratio 0 or no ratio key).
    Dense,
}

/// PLE n-gram table settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PleParams {
    /// The one layer (a GDN layer) that runs the PLE block before its mixer.
    pub layer: usize,
    /// n-gram order N (2..=8); the conv dilation too.
    pub ngram: usize,
    pub heads_per_ngram: usize,
    /// Depthwise conv taps Kp.
    pub conv_kernel: usize,
    /// Resets the n-gram window and stands in for missing predecessors.
    pub eos: u32,
    /// Row width Dp of the table (`embedding_length_per_layer_input`).
    pub head_dim: usize,
    /// Hash multipliers, one per context slot (≥ N entries).
    pub multipliers: Vec<u64>,
    pub head_offsets: Vec<u64>,
    pub head_vocab_sizes: Vec<u64>,
}

impl PleParams {
    /// (N−1)·heads_per_ngram.
    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.heads_per_ngram
    }
}

/// All hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    /// Trunk layers run by the forward pass: `block_count − nextn_predict_layers`.
    pub n_layer: usize,
    /// MTP (next-token prediction) blocks stored after the trunk (`nextn_predict_layers`,
    /// default 0); the trunk skips them, [`super::Mtp`] loads the first.
    pub n_nextn: usize,
    pub eps: f32,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_sections: Vec<u32>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// `expert_feed_forward_length` (absent: taken from the expert tensors).
    pub n_ff_exp: Option<usize>,
    /// `expert_shared_feed_forward_length`, else `feed_forward_length` (absent: from tensors).
    pub n_ff_shexp: Option<usize>,
    pub ssm_conv: usize,
    pub ssm_inner: usize,
    pub ssm_state: usize,
    pub ssm_v_heads: usize,
    pub ssm_k_heads: usize,
    pub hc: usize,
    pub hc_rank: usize,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    pub layers: Vec<LayerKind>,
    pub ple: Option<PleParams>,
}

fn key(k: &str) -> String {
    format!("{A}.{k}")
}

fn bad(k: &str, reason: impl Into<String>) -> EngineError {
    EngineError::BadMetadata { key: key(k), why: reason.into() }
}

fn req_usize(g: &GgufFile, k: &str) -> Result<usize, EngineError> {
    Ok(g.get_u32(&key(k))? as usize)
}

fn opt_usize(g: &GgufFile, k: &str, default: usize) -> Result<usize, EngineError> {
    match g.get(&key(k)) {
        None => Ok(default),
        Some(_) => req_usize(g, k),
    }
}

fn positive(g: &GgufFile, k: &str) -> Result<usize, EngineError> {
    let v = req_usize(g, k)?;
    if v == 0 {
        return Err(bad(k, "must be > 0"));
    }
    Ok(v)
}

fn array<'a>(g: &'a GgufFile, k: &str) -> Result<Option<&'a [Value]>, EngineError> {
    match g.get(&key(k)) {
        None => Ok(None),
        Some(_) => Ok(Some(g.get_array(&key(k))?)),
    }
}

fn u64_array(g: &GgufFile, k: &str, min_len: usize) -> Result<Vec<u64>, EngineError> {
    let a = array(g, k)?.ok_or_else(|| EngineError::MissingKey { key: key(k) })?;
    let v: Option<Vec<u64>> = a.iter().map(Value::as_u64).collect();
    let v = v.ok_or_else(|| bad(k, "expected an array of unsigned integers"))?;
    if v.len() < min_len {
        return Err(bad(k, format!("needs at least {min_len} entries, has {}", v.len())));
    }
    Ok(v)
}

impl HParams {
    /// Reads and validates every key. `n_vocab` comes from `token_embd.weight`.
    pub fn from_gguf(g: &GgufFile) -> Result<HParams, EngineError> {
        let arch = g.architecture()?;
        if arch != A {
            return Err(EngineError::WrongArchitecture(arch.to_string()));
        }
        let n_vocab = g
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| EngineError::MissingTensor { name: "token_embd.weight".into(), expected: Vec::new() })?
            as usize;
        let n_embd = positive(g, "embedding_length")?;
        let n_block = positive(g, "block_count")?;
        // The real checkpoints count the MTP block in block_count (49 = 48 trunk + 1 MTP).
        let n_nextn = opt_usize(g, "nextn_predict_layers", 0)?;
        if n_nextn >= n_block {
            return Err(bad("nextn_predict_layers", format!("{n_nextn} leaves no trunk layer of {n_block} blocks")));
        }
        let n_layer = n_block - n_nextn;
        crate::hparams::check_layer_count(g, &key("block_count"), n_layer)?;
        let n_ctx_train = positive(g, "context_length")?;
        let eps = crate::hparams::check_rms_eps(g.get_f32(&key("attention.layer_norm_rms_epsilon"))?)
            .map_err(|why| bad("attention.layer_norm_rms_epsilon", why))?;
        // llama.cpp reads n_head without a default check; 0 gives a tensor shape mismatch there.
        let n_head = positive(g, "attention.head_count")?;
        let n_head_kv = opt_usize(g, "attention.head_count_kv", n_head)?; // default: n_head (MHA)
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad("attention.head_count_kv", format!("{n_head_kv} must divide head_count {n_head}")));
        }
        let head_dim = opt_usize(g, "attention.key_length", n_embd / n_head)?; // default n_embd/n_head
        let v_len = opt_usize(g, "attention.value_length", n_embd / n_head)?;
        if v_len != head_dim {
            return Err(bad("attention.value_length", format!("{v_len} must equal key_length {head_dim}")));
        }
        let n_rot = opt_usize(g, "rope.dimension_count", head_dim)?; // default: full rotary
        let rope_base = match g.get(&key("rope.freq_base")) {
            None => 10_000.0, // llama.cpp default
            Some(_) => crate::hparams::check_rope_base(g.get_f32(&key("rope.freq_base"))?)
                .map_err(|why| bad("rope.freq_base", why))?,
        };
        let secs = array(g, "rope.dimension_sections")?
            .ok_or_else(|| EngineError::MissingKey { key: key("rope.dimension_sections") })?;
        let rope_sections: Vec<u32> = secs.iter().filter_map(Value::as_u32).collect();
        if rope_sections.len() != secs.len() {
            return Err(bad("rope.dimension_sections", "expected integers"));
        }
        if n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim {
            return Err(bad("rope.dimension_count", format!("{n_rot} must be even, > 0 and <= head dim {head_dim}")));
        }
        let n_expert = positive(g, "expert_count")?;
        let n_expert_used = positive(g, "expert_used_count")?;
        if n_expert_used > n_expert {
            return Err(bad("expert_used_count", format!("{n_expert_used} > expert_count {n_expert}")));
        }
        let opt_pos = |k: &str| -> Result<Option<usize>, EngineError> {
            match g.get(&key(k)) {
                None => Ok(None),
                Some(_) => positive(g, k).map(Some),
            }
        };
        let n_ff_exp = opt_pos("expert_feed_forward_length")?;
        let n_ff_shexp = match opt_pos("expert_shared_feed_forward_length")? {
            Some(v) => Some(v),
            None => opt_pos("feed_forward_length")?,
        };
        let ssm_conv = positive(g, "ssm.conv_kernel")?;
        let ssm_inner = positive(g, "ssm.inner_size")?;
        let ssm_state = positive(g, "ssm.state_size")?;
        let ssm_v_heads = positive(g, "ssm.time_step_rank")?;
        let ssm_k_heads = positive(g, "ssm.group_count")?;
        if ssm_inner != ssm_v_heads * ssm_state {
            return Err(bad(
                "ssm.inner_size",
                format!("{ssm_inner} != time_step_rank {ssm_v_heads} x state {ssm_state}"),
            ));
        }
        let hc = positive(g, "hyper_connection.count")?;
        if hc < 2 {
            return Err(bad("hyper_connection.count", "must be > 1"));
        }
        let hc_rank = positive(g, "hyper_connection.low_rank")?;
        let idx_heads = positive(g, "attention.indexer.head_count")?;
        let idx_dim = positive(g, "attention.indexer.key_length")?;
        let idx_top_k = positive(g, "attention.indexer.top_k")?;
        if n_rot > idx_dim {
            // llama.cpp aborts in ggml_rope here; we refuse to load instead.
            return Err(bad("rope.dimension_count", format!("{n_rot} > indexer key_length {idx_dim}")));
        }

        // Layer types: the bool array wins, else every `interval`-th layer is attention.
        let recurrent: Vec<bool> = match array(g, "attention.recurrent_layers")? {
            Some(a) => {
                let v: Option<Vec<bool>> =
                    a.iter().map(|x| x.as_bool().or_else(|| x.as_u32().map(|u| u != 0))).collect();
                let v = v.ok_or_else(|| bad("attention.recurrent_layers", "expected bools"))?;
                if v.len() < n_layer {
                    return Err(bad("attention.recurrent_layers", format!("{} entries for {n_layer} layers", v.len())));
                }
                v
            }
            None => {
                let fai = opt_usize(g, "full_attention_interval", 4)?; // llama.cpp default 4
                if fai == 0 {
                    return Err(bad("full_attention_interval", "must be > 0"));
                }
                (0..n_layer).map(|i| (i + 1) % fai != 0).collect()
            }
        };
        let ratios: Vec<usize> = match array(g, "attention.compress_ratios")? {
            Some(a) => {
                let v: Option<Vec<usize>> = a.iter().map(|x| x.as_u32().map(|u| u as usize)).collect();
                let v = v.ok_or_else(|| bad("attention.compress_ratios", "expected integers"))?;
                if v.len() < n_layer {
                    return Err(bad("attention.compress_ratios", format!("{} entries for {n_layer} layers", v.len())));
                }
                v
            }
            None => vec![0; n_layer], // absent: dense attention everywhere
        };
        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            layers.push(if recurrent[il] {
                LayerKind::Gdn
            } else if ratios[il] > 0 {
                if ratios[il] > 64 {
                    return Err(bad("attention.compress_ratios", format!("layer {il}: ratio {} > 64", ratios[il])));
                }
                LayerKind::Qsa { ratio: ratios[il] }
            } else {
                LayerKind::Dense
            });
        }

        let ple = match array(g, "ple.layers")? {
            None => None,
            Some(a) => {
                let l: Vec<usize> = a.iter().filter_map(|x| x.as_u32().map(|u| u as usize)).collect();
                if l.len() != 1 || a.len() != 1 {
                    return Err(bad("ple.layers", "exactly one PLE layer is supported"));
                }
                let layer = l[0];
                if layer >= n_layer || layers[layer] != LayerKind::Gdn {
                    return Err(bad("ple.layers", format!("layer {layer} is not a GDN layer")));
                }
                let ngram = req_usize(g, "ple.ngram_size")?;
                if !(2..=8).contains(&ngram) {
                    return Err(bad("ple.ngram_size", format!("{ngram} not in 2..=8")));
                }
                let heads_per_ngram = positive(g, "ple.heads_per_ngram")?;
                let conv_kernel = positive(g, "ple.conv_kernel")?;
                let eos = g.get_u32(&key("ple.eos_token_id"))?;
                let head_dim = positive(g, "embedding_length_per_layer_input")?;
                let nph = (ngram - 1) * heads_per_ngram;
                if nph * head_dim != n_embd {
                    return Err(bad(
                        "embedding_length_per_layer_input",
                        format!("{nph} heads x {head_dim} != n_embd {n_embd}"),
                    ));
                }
                let multipliers = u64_array(g, "ple.layer_multipliers", ngram)?;
                let head_offsets = u64_array(g, "ple.head_offsets", nph)?;
                let head_vocab_sizes = u64_array(g, "ple.head_vocab_sizes", nph)?;
                if head_vocab_sizes[..nph].contains(&0) {
                    return Err(bad("ple.head_vocab_sizes", "zero-sized head"));
                }
                Some(PleParams {
                    layer,
                    ngram,
                    heads_per_ngram,
                    conv_kernel,
                    eos,
                    head_dim,
                    multipliers,
                    head_offsets,
                    head_vocab_sizes,
                })
            }
        };

        Ok(HParams {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_nextn,
            eps,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base,
            rope_sections,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
            ssm_conv,
            ssm_inner,
            ssm_state,
            ssm_v_heads,
            ssm_k_heads,
            hc,
            hc_rank,
            idx_heads,
            idx_dim,
            idx_top_k,
            layers,
            ple,
        })
    }
}
