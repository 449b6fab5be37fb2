//! Hyper-connection residual streams ("GR"): the residual is `hc` parallel copies of the hidden
//! state. Before each block a gated mix reads them into one block input; after the block every
//! stream receives the block output scaled by its own injection gate.
//!
//! ```text
//! X[c] = rms(R[c]; γ[c])            f = flatten(X) (stream-major)
//! a    = silu((W_down f) / hc)      G = reshape(W_up a, [hc, E])
//! x    = (1/hc) Σ_c X[c] ⊙ σ(G[c])  inj = W_inj f
//! combine: R[c] += 2·σ(inj[c]/hc) · y
//! ```
//! No Sinkhorn step and no stream mixing matrix (identity "comb"); the 2.0 is hard-coded in
//! llama.cpp's graph. The mix for several tokens reads each weight row once per group of 8
//! tokens (`Mat::matmul`) and is bit-identical to single-token mixes.

use crate::Mat;

/// One HC mixer (`hc_attn_*`, `hc_ffn_*` or the final `output_hc_*`).
#[derive(Debug)]
pub struct HyperConn {
    pub hc: usize,
    pub n_embd: usize,
    pub eps: f32,
    /// RMSNorm gammas `[hc][E]`.
    pub norm: Vec<f32>,
    /// `[lr][hc·E]`.
    pub down: Mat,
    /// `[hc·E][lr]`.
    pub up: Mat,
    /// `[hc][hc·E]`; `None` for the final head mixer (no injection).
    pub inject: Option<Mat>,
}
