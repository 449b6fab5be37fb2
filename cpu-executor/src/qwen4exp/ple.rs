//! The PLE n-gram block on the CPU (described in `model::qwen4exp::ple`).

use super::linear::{Numerics, NumericsCpu, rms_norm};
use model::qwen4exp::{Ple, PleState};

/// The CPU executor's methods on [`Ple`] (a type of the `model` crate, which knows no backend).
pub trait PleCpu {
    /// Applies the block to the streams `r [n][hc][E]` of tokens `toks` (advancing `st`).
    /// Returns an error message naming the row if a hashed row is outside the table.
    fn forward(&self, r: &mut [f32], toks: &[u32], st: &mut PleState) -> Result<(), String> {
        self.forward_with(Numerics::Llama, r, toks, st)
    }

    /// [`Self::forward`] in the float order `num` names.
    fn forward_with(&self, num: Numerics, r: &mut [f32], toks: &[u32], st: &mut PleState) -> Result<(), String>;
}

impl PleCpu for Ple {
    fn forward_with(&self, num: Numerics, r: &mut [f32], toks: &[u32], st: &mut PleState) -> Result<(), String> {
        let (hc, e, n) = (self.hc, self.n_embd, toks.len());
        let hce = hc * e;
        let emb = self.gather(toks, st, team_for_each)?;
        let mut key = vec![0f32; n * hce];
        num.matmul(&self.key, &emb, n, &mut key);
        let mut val = vec![0f32; n * e];
        num.matmul(&self.value, &emb, n, &mut val);
        PleBlock::of(self).mix_with(num, &key, &val, r, n, &mut st.hist);
        Ok(())
    }
}

/// The PLE table's parallel row reads ([`model::qwen4exp::ParFor`]) as tasks of the forward
/// pass's thread team (`cpu_kernels::team::for_each`, rayon's loop outside a team): `model`
/// knows no backend, so the executors hand it this loop.
pub fn team_for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    cpu_kernels::team::for_each(n, f)
}

/// The PLE block after the row gather and the key / value projections (the device runs the
/// same part: `GpuOps::ple_block`): the per-stream gate, the gated value's norm and the dilated
/// causal conv over its history, added to the streams.
pub struct PleBlock<'a> {
    pub hc: usize,
    pub e: usize,
    pub eps: f32,
    pub conv_kernel: usize,
    /// The conv's dilation, the n-gram order N.
    pub dilation: usize,
    /// `[hc][E]` each.
    pub norm_key: &'a [f32],
    pub norm_query: &'a [f32],
    pub norm_conv: &'a [f32],
    /// `[hc·E][Kp]`.
    pub conv: &'a [f32],
}

impl PleBlock<'_> {
    pub fn of(p: &Ple) -> PleBlock<'_> {
        PleBlock {
            hc: p.hc,
            e: p.n_embd,
            eps: p.eps,
            conv_kernel: p.params.conv_kernel,
            dilation: p.params.ngram,
            norm_key: &p.norm_key,
            norm_query: &p.norm_query,
            norm_conv: &p.norm_conv,
            conv: &p.conv,
        }
    }

    /// `key [n][hc][E]` and `val [n][E]` of the window's rows into the streams `r [n][hc][E]`,
    /// advancing the conv history `hist [(Kp − 1)·N][hc·E]`.
    pub fn mix(&self, key: &[f32], val: &[f32], r: &mut [f32], n: usize, hist: &mut [f32]) {
        self.mix_with(Numerics::Llama, key, val, r, n, hist)
    }

    /// [`PleBlock::mix`] in the float order `num` names.
    pub fn mix_with(&self, num: Numerics, key: &[f32], val: &[f32], r: &mut [f32], n: usize, hist: &mut [f32]) {
        let (hc, e) = (self.hc, self.e);
        let hce = hc * e;
        let inv_sqrt_e = 1.0 / (e as f32).sqrt();
        let mut gv = vec![0f32; n * hce];
        let mut nn = vec![0f32; n * hce];
        let (mut kc, mut qc) = (vec![0f32; e], vec![0f32; e]);
        for t in 0..n {
            for c in 0..hc {
                let o = t * hce + c * e;
                let g = &self.norm_key[c * e..(c + 1) * e];
                rms_norm(&key[o..o + e], Some(g), self.eps, &mut kc);
                rms_norm(&r[o..o + e], Some(&self.norm_query[c * e..(c + 1) * e]), self.eps, &mut qc);
                let s = kc.iter().zip(&qc).map(|(a, b)| a * b).sum::<f32>() * inv_sqrt_e;
                let sign = if s > 0.0 {
                    1.0
                } else if s < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let gate = num.sigmoid(sign * s.abs().max(1e-6).sqrt());
                for (gvv, &vv) in gv[o..o + e].iter_mut().zip(&val[t * e..(t + 1) * e]) {
                    *gvv = gate * vv;
                }
                rms_norm(&gv[o..o + e], Some(&self.norm_conv[c * e..(c + 1) * e]), self.eps, &mut nn[o..o + e]);
            }
        }

        // Dilated causal depthwise conv over [history | new].
        let (kp, dil) = (self.conv_kernel, self.dilation);
        let hlen = (kp - 1) * dil;
        let mut all = Vec::with_capacity((hlen + n) * hce);
        all.extend_from_slice(hist);
        all.extend_from_slice(&nn);
        for t in 0..n {
            for ch in 0..hce {
                let mut acc = 0f32;
                for k in 0..kp {
                    acc += self.conv[ch * kp + k] * all[(hlen + t - (kp - 1 - k) * dil) * hce + ch];
                }
                let o = t * hce + ch;
                r[o] = (r[o] + gv[o]) + num.silu(acc);
            }
        }
        hist.copy_from_slice(&all[n * hce..]);
    }
}
