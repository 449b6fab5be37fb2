//! LLaMA (`llama`, also SmolLM2): pre-norm decoder, SwiGLU FFN, "normal" (adjacent-pair) rope
//! (the GGUF converter permutes Q/K rows for it), optional separate `output.weight`.

use super::hparams::{Act, AttnSpec, HParams, Keys, LayerKind, RopeKind};
use crate::error::Result;

pub fn hparams(k: &Keys) -> Result<HParams> {
    let c = k.common()?;
    let rope_scale = k.rope_freq_scale()?;
    Ok(HParams {
        arch: k.arch,
        n_layer: c.n_layer,
        n_ctx_train: c.n_ctx_train,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
        rms_eps: c.rms_eps,
        rope: RopeKind::Norm,
        rope_dim: c.rope_dim,
        act: Act::Silu,
        q_scale: 1.0,
        kq_scale: 1.0 / (c.head_dim as f32).sqrt(),
        embd_scale: None,
        qk_norm: false,
        qkv_bias: false,
        post_norms: false,
        moe: None,
        layers: vec![LayerKind::Attention(AttnSpec { window: None, rope_base: c.rope_base, rope_scale }); c.n_layer],
    })
}
