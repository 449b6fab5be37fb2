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
//! tokens ([`Mat::matmul`]) and is bit-identical to single-token mixes.

use super::linear::{Mat, rms_norm, sigmoid, silu};

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

impl HyperConn {
    /// Reads the streams `r [n][hc][E]` into the block input `x [n][E]` and, when this mixer
    /// has an injection matrix, the raw injection logits `inj [n][hc]`.
    pub fn mix(&self, r: &[f32], n: usize, x: &mut [f32], inj: Option<&mut [f32]>) {
        let (hc, e) = (self.hc, self.n_embd);
        let hce = hc * e;
        let mut flat = vec![0f32; n * hce];
        for t in 0..n {
            for c in 0..hc {
                let o = t * hce + c * e;
                rms_norm(
                    &r[o..o + e],
                    Some(&self.norm[c * e..(c + 1) * e]),
                    self.eps,
                    &mut flat[o..o + e],
                );
            }
        }
        let lr = self.down.rows;
        let mut lo = vec![0f32; n * lr];
        self.down.matmul(&flat, n, &mut lo);
        let inv_hc = 1.0 / hc as f32;
        lo.iter_mut().for_each(|v| *v = silu(*v * inv_hc));
        let mut gate = vec![0f32; n * hce];
        self.up.matmul(&lo, n, &mut gate);
        for t in 0..n {
            let xo = &mut x[t * e..(t + 1) * e];
            for (i, xv) in xo.iter_mut().enumerate() {
                let mut s = 0f32;
                for c in 0..hc {
                    let o = t * hce + c * e + i;
                    s += flat[o] * sigmoid(gate[o]);
                }
                *xv = s * inv_hc;
            }
        }
        if let (Some(w), Some(out)) = (&self.inject, inj) {
            w.matmul(&flat, n, out);
        }
    }

    /// `R[t][c] += 2·σ(inj[t][c]/hc) · y[t]` for every stream.
    pub fn combine(&self, r: &mut [f32], n: usize, y: &[f32], inj: &[f32]) {
        let (hc, e) = (self.hc, self.n_embd);
        let inv_hc = 1.0 / hc as f32;
        for t in 0..n {
            for c in 0..hc {
                let w = 2.0 * sigmoid(inj[t * hc + c] * inv_hc);
                let rs = &mut r[(t * hc + c) * e..(t * hc + c + 1) * e];
                rs.iter_mut()
                    .zip(&y[t * e..(t + 1) * e])
                    .for_each(|(rv, &yv)| *rv += w * yv);
            }
        }
    }
}
