//! The hyper-connection read (mix) and write (combine) on the CPU (described in
//! `model::qwen4exp::gr`).

use super::linear::{Numerics, NumericsCpu, rms_norm};
use model::qwen4exp::HyperConn;

/// The CPU executor's methods on [`HyperConn`] (a type of the `model` crate, which knows no backend).
pub trait HyperConnCpu {
    /// Reads the streams `r [n][hc][E]` into the block input `x [n][E]` and, when this mixer
    /// has an injection matrix, the raw injection logits `inj [n][hc]`.
    fn mix(&self, r: &[f32], n: usize, x: &mut [f32], inj: Option<&mut [f32]>) {
        self.mix_with(Numerics::Llama, r, n, x, inj)
    }

    /// [`Self::mix`] in the float order `num` names.
    fn mix_with(&self, num: Numerics, r: &[f32], n: usize, x: &mut [f32], inj: Option<&mut [f32]>);

    /// `X[t][c] = rms(R[t][c]; γ[c])`, `[n][hc][E]` (what the GPU's `gr_stream_norm` computes).
    fn norm_streams(&self, r: &[f32], n: usize) -> Vec<f32>;

    /// `a = silu(lo / hc)` in place on the down projection (`gr_lowrank_act`).
    fn lowrank_act(&self, lo: &mut [f32]) {
        self.lowrank_act_with(Numerics::Llama, lo)
    }

    fn lowrank_act_with(&self, num: Numerics, lo: &mut [f32]);

    /// `x[t] = (1/hc) Σ_c X[t][c] ⊙ σ(G[t][c])` (`gr_gate_mix`).
    fn gate_mix(&self, flat: &[f32], gate: &[f32], n: usize, x: &mut [f32]) {
        self.gate_mix_with(Numerics::Llama, flat, gate, n, x)
    }

    fn gate_mix_with(&self, num: Numerics, flat: &[f32], gate: &[f32], n: usize, x: &mut [f32]);

    /// `R[t][c] += 2·σ(inj[t][c]/hc) · y[t]` for every stream.
    fn combine(&self, r: &mut [f32], n: usize, y: &[f32], inj: &[f32]) {
        self.combine_with(Numerics::Llama, r, n, y, inj)
    }

    fn combine_with(&self, num: Numerics, r: &mut [f32], n: usize, y: &[f32], inj: &[f32]);
}

impl HyperConnCpu for HyperConn {
    fn mix_with(&self, num: Numerics, r: &[f32], n: usize, x: &mut [f32], inj: Option<&mut [f32]>) {
        let hce = self.hc * self.n_embd;
        let flat = self.norm_streams(r, n);
        let lr = self.down.rows;
        let mut lo = vec![0f32; n * lr];
        num.matmul(&self.down, &flat, n, &mut lo);
        self.lowrank_act_with(num, &mut lo);
        let mut gate = vec![0f32; n * hce];
        num.matmul(&self.up, &lo, n, &mut gate);
        self.gate_mix_with(num, &flat, &gate, n, x);
        if let (Some(w), Some(out)) = (&self.inject, inj) {
            num.matmul(w, &flat, n, out);
        }
    }

    fn norm_streams(&self, r: &[f32], n: usize) -> Vec<f32> {
        let (hc, e) = (self.hc, self.n_embd);
        let mut flat = vec![0f32; n * hc * e];
        for t in 0..n {
            for c in 0..hc {
                let o = (t * hc + c) * e;
                rms_norm(&r[o..o + e], Some(&self.norm[c * e..(c + 1) * e]), self.eps, &mut flat[o..o + e]);
            }
        }
        flat
    }

    fn lowrank_act_with(&self, num: Numerics, lo: &mut [f32]) {
        let inv_hc = 1.0 / self.hc as f32;
        lo.iter_mut().for_each(|v| *v = num.silu(*v * inv_hc));
    }

    fn gate_mix_with(&self, num: Numerics, flat: &[f32], gate: &[f32], n: usize, x: &mut [f32]) {
        let (hc, e) = (self.hc, self.n_embd);
        let (hce, inv_hc) = (hc * e, 1.0 / hc as f32);
        for t in 0..n {
            let xo = &mut x[t * e..(t + 1) * e];
            for (i, xv) in xo.iter_mut().enumerate() {
                let mut s = 0f32;
                for c in 0..hc {
                    let o = t * hce + c * e + i;
                    s += flat[o] * num.sigmoid(gate[o]);
                }
                *xv = s * inv_hc;
            }
        }
    }

    fn combine_with(&self, num: Numerics, r: &mut [f32], n: usize, y: &[f32], inj: &[f32]) {
        let (hc, e) = (self.hc, self.n_embd);
        let inv_hc = 1.0 / hc as f32;
        for t in 0..n {
            for c in 0..hc {
                let w = 2.0 * num.sigmoid(inj[t * hc + c] * inv_hc);
                let rs = &mut r[(t * hc + c) * e..(t * hc + c + 1) * e];
                rs.iter_mut().zip(&y[t * e..(t + 1) * e]).for_each(|(rv, &yv)| *rv += w * yv);
            }
        }
    }
}
