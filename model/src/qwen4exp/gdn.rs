//! Gated DeltaNet token mixer (the recurrent layers).
//!
//! ```text
//! m = W_qkv x (conv channels [q | k | v]),  z = W_gate x,  β = σ(W_beta x),
//! g = softplus(W_alpha x + dt_bias) · ssm_a            (ssm_a < 0, so e^g ∈ (0, 1))
//! u_t = silu(Σ_k conv[ch,k] · m_{t−K+1+k}[ch])         causal depthwise conv, zero history
//! q, k ← L2-normalised per head; value head h reads key head h mod Hk (tiled)
//! M ← e^g M;  δ = β (v − Mᵀk);  M ← M + k δᵀ;  o = Mᵀq / √S      (M is key × value)
//! y = W_out · concat_h( rms(o_h; ssm_norm) ⊙ σ(z_h) )  (sigmoid gate, not Qwen3.5's silu)
//! ```
//! The recurrence is what llama.cpp's fused op computes token by token. [`GdnMode::Chunked`]
//! computes the same thing a chunk at a time: with `G_t` the in-chunk cumulative sum of `g`,
//! `M_t = e^{G_t} M₀ + Σ_{i≤t} e^{G_t−G_i} k_i δ_iᵀ`, so the chunk's `δ` solve the unit lower
//! triangular system `δ_t + Σ_{i<t} β_t e^{G_t−G_i} (k_t·k_i) δ_i = β_t (v_t − e^{G_t} M₀ᵀ k_t)`
//! and the outputs and final state follow from `δ` with matrix products (the prefill form used
//! by GPU kernels). The two agree to f32 rounding (tests/models/models_qwen4exp.rs).

use crate::Mat;

/// How a multi-token pass runs the delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GdnMode {
    /// Token-by-token recurrence (llama.cpp's order of operations).
    #[default]
    Recurrent,
    /// Chunked prefill with chunks of this many tokens (≥ 1).
    Chunked(usize),
}

/// Weights of one GDN layer.
#[derive(Debug)]
pub struct Gdn {
    /// Key heads Hk (`ssm.group_count`).
    pub hk: usize,
    /// Value heads Hv (`ssm.time_step_rank`).
    pub hv: usize,
    /// Head dim S (`ssm.state_size`).
    pub s: usize,
    /// Conv width K.
    pub conv_k: usize,
    pub eps: f32,
    /// `[2·Hk·S + Hv·S][E]`.
    pub qkv: Mat,
    /// `[Hv·S][E]`.
    pub gate: Mat,
    /// Conv taps `[C][K]`.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `ssm_a = −exp(A_log)`.
    pub a: Vec<f32>,
    /// `[Hv][E]`.
    pub beta: Mat,
    /// `[Hv][E]`.
    pub alpha: Mat,
    /// Gated-norm gamma `[S]`, shared by the heads.
    pub norm: Vec<f32>,
    /// `[E][Hv·S]`.
    pub out: Mat,
}

/// Recurrent state of one GDN layer for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnState {
    /// The last K−1 conv inputs `m`, oldest first, `[(K−1)][C]`.
    pub conv: Vec<f32>,
    /// Delta-rule state per value head, `[Hv][S key][S value]`.
    pub m: Vec<f32>,
}

impl Gdn {
    /// Conv channels C = 2·Hk·S + Hv·S.
    pub fn channels(&self) -> usize {
        (2 * self.hk + self.hv) * self.s
    }

    pub fn new_state(&self) -> GdnState {
        GdnState { conv: vec![0.0; (self.conv_k - 1) * self.channels()], m: vec![0.0; self.hv * self.s * self.s] }
    }
}
