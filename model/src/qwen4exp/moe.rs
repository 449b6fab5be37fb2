//! Mixture-of-experts FFN with a sigmoid-gated shared expert.
//!
//! ```text
//! p = softmax(W_router x);  S = top-k experts by p;  w_e = p_e / max(Σ_S p, 6.1e-5)
//! y = Σ_{e∈S} w_e · Wd_e(silu(Wg_e x) ⊙ Wu_e x) + σ(w_sh·x) · Wd_sh(silu(Wg_sh x) ⊙ Wu_sh x)
//! ```
//! No expert weight scale is applied (llama.cpp does not read `expert_weights_scale` for this
//! architecture). Ties in p keep the lower expert id.

use crate::Mat;

/// One SwiGLU FFN (an expert or the shared expert).
#[derive(Debug)]
pub struct SwiGlu {
    /// `[ff][E]`.
    pub gate: Mat,
    /// `[ff][E]`.
    pub up: Mat,
    /// `[E][ff]`.
    pub down: Mat,
}

/// Weights of one MoE FFN.
#[derive(Debug)]
pub struct Moe {
    pub n_used: usize,
    /// `[n_expert][E]`.
    pub router: Mat,
    pub experts: Vec<SwiGlu>,
    /// `[E]` shared-expert gate.
    pub shared_gate: Mat,
    pub shared: SwiGlu,
}

/// ggml clamps the renormalisation denominator to the smallest normal f16.
pub const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;
