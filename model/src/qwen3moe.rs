//! Qwen3-MoE (`qwen3moe`): Qwen3 attention; every FFN is a routed mixture of SwiGLU experts.
//!
//! Router: softmax over `ffn_gate_inp` logits, top `expert_used_count` experts (ties go to the
//! lower index), weights renormalised to sum 1 when `expert_weights_norm` (llama.cpp always
//! renormalises for qwen3moe, so that is the default).

use super::hparams::{HParams, Keys, MoeSpec};
use crate::error::{EngineError, Result};

pub fn hparams(k: &Keys) -> Result<HParams> {
    let mut hp = super::qwen3::hparams(k)?;
    let n_expert = k.u32("expert_count")?;
    let n_expert_used = k.u32("expert_used_count")?;
    if n_expert_used == 0 || n_expert_used > n_expert {
        return Err(EngineError::BadMetadata {
            key: format!("{}.expert_used_count", k.arch),
            why: format!("{n_expert_used} not in 1..={n_expert}"),
        });
    }
    // Without the key llama.cpp falls back to feed_forward_length.
    let n_ff_exp = k.u32_or("expert_feed_forward_length", hp.n_ff)?;
    let norm_weights = k.bool_or("expert_weights_norm", true);
    hp.moe = Some(MoeSpec { n_expert, n_expert_used, n_ff_exp, norm_weights, shared_expert: None });
    Ok(hp)
}
