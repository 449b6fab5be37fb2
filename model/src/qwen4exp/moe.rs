//! qwen4exp's MoE FFN weights: the shared [`MoeSpec`] with renormalised weights and a
//! sigmoid-gated shared expert. Its routed experts are one matrix each (the expert tiers copy
//! and compute them one by one). No expert weight scale is applied (llama.cpp does not read
//! `expert_weights_scale` for this architecture).

use crate::{Mat, MoeSpec, SharedExpertSpec};

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
    /// The shape: `norm_weights` set, `shared_expert` present.
    pub spec: MoeSpec,
    /// `[n_expert][E]`.
    pub router: Mat,
    pub experts: Vec<SwiGlu>,
    /// `[E]` shared-expert gate.
    pub shared_gate: Mat,
    pub shared: SwiGlu,
}

pub use crate::MIN_WEIGHT_SUM;

/// qwen4exp's MoE shape: `n_used` of `n_expert` experts `n_ff` wide with renormalised weights,
/// and a shared expert `n_ff_shared` wide.
pub fn spec(n_expert: usize, n_used: usize, n_ff: usize, n_ff_shared: usize) -> MoeSpec {
    MoeSpec {
        n_expert,
        n_expert_used: n_used,
        n_ff_exp: n_ff,
        norm_weights: true,
        shared_expert: Some(SharedExpertSpec { n_ff: n_ff_shared }),
    }
}
