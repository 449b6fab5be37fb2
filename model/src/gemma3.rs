//! Gemma 3 (`gemma3`): interleaved sliding-window / global attention, per-head Q/K RMSNorm,
//! pre and post norms around attention and FFN, GeGLU (tanh GELU), embeddings scaled by
//! sqrt(n_embd), output head tied to `token_embd`.
//!
//! Layer `il` is global when `(il + 1) % pattern == 0` (pattern 6: layers 5, 11, 17 of 18),
//! with rope base `gemma3.rope.freq_base` (1e6) and the file's linear rope scaling; the other
//! layers use a window of `gemma3.attention.sliding_window` tokens and rope base 10000, scale 1
//! (llama.cpp hard-codes both for the local layers of Gemma 3).

use super::hparams::{Act, AttnSpec, HParams, Keys, LayerKind, RopeKind};
use crate::error::Result;

/// Every 6th layer is global (llama.cpp `set_swa_pattern(6)`).
const SWA_PATTERN: usize = 6;
/// Rope base of the sliding-window layers (not stored in the GGUF).
const ROPE_BASE_SWA: f32 = 10000.0;

pub fn hparams(k: &Keys) -> Result<HParams> {
    let c = k.common()?;
    // Gemma 3 270M stores 512; 4096 is the value of the larger Gemma 3 checkpoints.
    let window = k.u32_or("attention.sliding_window", 4096)?;
    let global_scale = k.rope_freq_scale()?;
    let layers = (0..c.n_layer)
        .map(|il| {
            let global = (il + 1) % SWA_PATTERN == 0;
            LayerKind::Attention(if global {
                AttnSpec { window: None, rope_base: c.rope_base, rope_scale: global_scale }
            } else {
                AttnSpec { window: Some(window), rope_base: ROPE_BASE_SWA, rope_scale: 1.0 }
            })
        })
        .collect();
    // query_pre_attn_scalar: head_dim, except the 27B model (62 layers) which uses n_embd/n_head.
    let q_pre = if c.n_layer == 62 { c.n_embd / c.n_head } else { c.head_dim };
    Ok(HParams {
        arch: super::Arch::Gemma3,
        n_layer: c.n_layer,
        n_ctx_train: c.n_ctx_train,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
        rms_eps: c.rms_eps,
        rope: RopeKind::Neox,
        rope_dim: c.rope_dim,
        act: Act::GeluTanh,
        q_scale: 1.0 / (q_pre as f32).sqrt(),
        kq_scale: 1.0,
        embd_scale: Some((c.n_embd as f32).sqrt()),
        qk_norm: true,
        qkv_bias: false,
        post_norms: true,
        moe: None,
        layers,
    })
}
