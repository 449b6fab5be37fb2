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
    // A window of 0 keys attends to nothing: garbage with exit 0 before this check (issue 39).
    if window == 0 {
        return Err(crate::error::EngineError::BadMetadata {
            key: format!("{}.attention.sliding_window", k.arch),
            why: "0 tokens: the sliding window must be > 0 (Gemma 3 270M stores 512)".into(),
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::{GgufFile, GgufWriter, Value};

    /// A one-layer Gemma 3 header (hyperparameters only, one tensor so the layer exists).
    fn gemma(window: u32) -> GgufFile {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::Str("gemma3".into()));
        for (k, v) in [
            ("block_count", 1),
            ("embedding_length", 8),
            ("attention.head_count", 1),
            ("attention.sliding_window", window),
        ] {
            w.add_metadata(format!("gemma3.{k}"), Value::U32(v));
        }
        w.add_tensor("blk.0.attn_norm.weight", &[8], quant::GgmlType::F32, vec![0u8; 32]);
        GgufFile::from_bytes("gemma.gguf", w.to_bytes().unwrap()).unwrap()
    }

    #[test]
    fn a_sliding_window_of_0_is_refused() {
        let g = gemma(0);
        let err = hparams(&Keys { g: &g, arch: crate::Arch::Gemma3 }).unwrap_err().to_string();
        assert_eq!(
            err,
            "metadata 'gemma3.attention.sliding_window': 0 tokens: the sliding window must be > 0 (Gemma 3 270M stores 512)"
        );
        let g = gemma(512);
        let hp = hparams(&Keys { g: &g, arch: crate::Arch::Gemma3 }).unwrap();
        assert_eq!(
            hp.layers[0],
            LayerKind::Attention(AttnSpec { window: Some(512), rope_base: ROPE_BASE_SWA, rope_scale: 1.0 })
        );
    }
}
