//! The Gated DeltaNet token mixer on the CPU (the computation is described in
//! `model::qwen4exp::gdn`): projections, the causal conv, the delta rule per value head on the
//! thread team (recurrent, or chunked for prefill) and the gated norm.

use super::linear::{Numerics, NumericsCpu, rms_norm};
use model::qwen4exp::{Gdn, GdnMode, GdnState};

/// Per-token inputs of the delta rule for one value head.
struct HeadIn<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: f32,
    beta: f32,
}

/// The CPU executor's methods on [`Gdn`] (a type of the `model` crate, which knows no backend).
pub trait GdnCpu {
    /// Runs `n` tokens `x [n][E]`, advancing `st`; writes `y [n][E]`.
    fn forward(&self, x: &[f32], n: usize, st: &mut GdnState, mode: GdnMode, y: &mut [f32]) {
        self.forward_with(Numerics::Llama, x, n, st, mode, y)
    }

    /// [`Self::forward`] in the float order `num` names.
    fn forward_with(&self, num: Numerics, x: &[f32], n: usize, st: &mut GdnState, mode: GdnMode, y: &mut [f32]);

    /// The token mixer between the projections, what the GPU's `gdn_*` kernels compute: conv
    /// inputs `m [n][C]`, gate `z [n][Hv·S]`, β and α logits `[n][Hv]`; returns the gated,
    /// normalised head outputs `o [n][Hv·S]` (the input of `ssm_out`), advancing `st`.
    #[allow(clippy::too_many_arguments)]
    fn mix(
        &self,
        m: &[f32],
        z: &[f32],
        beta_logit: &[f32],
        alpha_logit: &[f32],
        n: usize,
        st: &mut GdnState,
        mode: GdnMode,
    ) -> Vec<f32> {
        self.mix_with(Numerics::Llama, m, z, beta_logit, alpha_logit, n, st, mode)
    }

    /// [`Self::mix`] in the float order `num` names.
    #[allow(clippy::too_many_arguments)]
    fn mix_with(
        &self,
        num: Numerics,
        m: &[f32],
        z: &[f32],
        beta_logit: &[f32],
        alpha_logit: &[f32],
        n: usize,
        st: &mut GdnState,
        mode: GdnMode,
    ) -> Vec<f32>;
}

impl GdnCpu for Gdn {
    fn forward_with(&self, num: Numerics, x: &[f32], n: usize, st: &mut GdnState, mode: GdnMode, y: &mut [f32]) {
        let (c, hv, vd) = (self.channels(), self.hv, self.hv * self.s);
        let mut m = vec![0f32; n * c];
        num.matmul(&self.qkv, x, n, &mut m);
        let mut z = vec![0f32; n * vd];
        num.matmul(&self.gate, x, n, &mut z);
        let mut beta = vec![0f32; n * hv];
        num.matmul(&self.beta, x, n, &mut beta);
        let mut alpha = vec![0f32; n * hv];
        num.matmul(&self.alpha, x, n, &mut alpha);
        let o = self.mix_with(num, &m, &z, &beta, &alpha, n, st, mode);
        num.matmul(&self.out, &o, n, y);
    }

    #[allow(clippy::too_many_arguments)]
    fn mix_with(
        &self,
        num: Numerics,
        m: &[f32],
        z: &[f32],
        beta_logit: &[f32],
        alpha_logit: &[f32],
        n: usize,
        st: &mut GdnState,
        mode: GdnMode,
    ) -> Vec<f32> {
        let (hk, hv, s, kk) = (self.hk, self.hv, self.s, self.conv_k);
        let c = self.channels();
        let vd = hv * s;
        let beta: Vec<f32> = beta_logit[..n * hv].iter().map(|&b| num.sigmoid(b)).collect();
        let mut g = alpha_logit[..n * hv].to_vec();
        for t in 0..n {
            for h in 0..hv {
                let v = &mut g[t * hv + h];
                *v = num.softplus(*v + self.dt_bias[h]) * self.a[h];
            }
        }

        // Causal depthwise conv over [history | new], then keep the last K−1 inputs.
        let mut hist = Vec::with_capacity((kk - 1 + n) * c);
        hist.extend_from_slice(&st.conv);
        hist.extend_from_slice(&m[..n * c]);
        let mut u = vec![0f32; n * c];
        for t in 0..n {
            for ch in 0..c {
                let mut acc = 0f32;
                for k in 0..kk {
                    acc += hist[(t + k) * c + ch] * self.conv[ch * kk + k];
                }
                u[t * c + ch] = num.silu(acc);
            }
        }
        st.conv.copy_from_slice(&hist[n * c..]);

        // L2-normalise q and k per key head: x / sqrt(Σx² + eps).
        let kd = hk * s;
        for t in 0..n {
            for h in 0..2 * hk {
                let head = &mut u[t * c + h * s..t * c + (h + 1) * s];
                let ss: f64 = head.iter().map(|&v| (v * v) as f64).sum();
                let inv = 1.0 / ((ss as f32) + self.eps).sqrt();
                head.iter_mut().for_each(|v| *v *= inv);
            }
        }

        // Delta rule, value heads in parallel on the thread team, each on its own state in
        // place; o [n][Hv][S].
        let mut o = vec![0f32; n * vd];
        let mut heads: Vec<(&mut [f32], Vec<f32>)> = st.m.chunks_mut(s * s).map(|mh| (mh, Vec::new())).collect();
        cpu_kernels::team::chunks_mut(&mut heads, 1, |h, one| {
            let (mh, out) = &mut one[0];
            let hk_i = h % hk; // tiled, not grouped
            let inputs: Vec<HeadIn> = (0..n)
                .map(|t| HeadIn {
                    q: &u[t * c + hk_i * s..t * c + (hk_i + 1) * s],
                    k: &u[t * c + kd + hk_i * s..t * c + kd + (hk_i + 1) * s],
                    v: &u[t * c + 2 * kd + h * s..t * c + 2 * kd + (h + 1) * s],
                    g: g[t * hv + h],
                    beta: beta[t * hv + h],
                })
                .collect();
            *out = match mode {
                GdnMode::Recurrent => recurrent(num, mh, s, &inputs),
                GdnMode::Chunked(cs) => chunked(num, mh, s, &inputs, cs.max(1)),
            };
        });
        for (h, (_, oh)) in heads.iter().enumerate() {
            for t in 0..n {
                o[t * vd + h * s..t * vd + (h + 1) * s].copy_from_slice(&oh[t * s..(t + 1) * s]);
            }
        }

        // Gated RMSNorm per head, sigmoid gate.
        let mut normed = vec![0f32; s];
        for t in 0..n {
            for h in 0..hv {
                let r = t * vd + h * s..t * vd + (h + 1) * s;
                rms_norm(&o[r.clone()], Some(&self.norm), self.eps, &mut normed);
                for ((ov, &nv), &zv) in o[r.clone()].iter_mut().zip(&normed).zip(&z[r]) {
                    *ov = nv * num.sigmoid(zv);
                }
            }
        }
        o
    }
}

/// Token-by-token delta rule for one head; returns `o [n][S]`, updates `mh [S][S]`.
fn recurrent(num: Numerics, mh: &mut [f32], s: usize, inputs: &[HeadIn]) -> Vec<f32> {
    let scale = 1.0 / (s as f32).sqrt();
    let mut out = vec![0f32; inputs.len() * s];
    let mut kv = vec![0f32; s];
    for (t, x) in inputs.iter().enumerate() {
        let decay = num.exp(x.g);
        mh.iter_mut().for_each(|v| *v *= decay);
        // kv = Mᵀ k
        kv.fill(0.0);
        for i in 0..s {
            let ki = x.k[i];
            for (kvj, &mij) in kv.iter_mut().zip(&mh[i * s..(i + 1) * s]) {
                *kvj += mij * ki;
            }
        }
        // δ = β (v − Mᵀk);  M += k δᵀ
        for (d, &vj) in kv.iter_mut().zip(x.v) {
            *d = (vj - *d) * x.beta;
        }
        for i in 0..s {
            let ki = x.k[i];
            for (mij, &dj) in mh[i * s..(i + 1) * s].iter_mut().zip(&kv) {
                *mij += ki * dj;
            }
        }
        // o = Mᵀ q / √S
        let o = &mut out[t * s..(t + 1) * s];
        for i in 0..s {
            let qi = x.q[i];
            for (oj, &mij) in o.iter_mut().zip(&mh[i * s..(i + 1) * s]) {
                *oj += mij * qi;
            }
        }
        o.iter_mut().for_each(|v| *v *= scale);
    }
    out
}

/// Chunked delta rule for one head (see the module doc); same contract as [`recurrent`].
fn chunked(num: Numerics, mh: &mut [f32], s: usize, inputs: &[HeadIn], chunk: usize) -> Vec<f32> {
    let scale = 1.0 / (s as f32).sqrt();
    let mut out = vec![0f32; inputs.len() * s];
    for (ci, ch) in inputs.chunks(chunk).enumerate() {
        let l = ch.len();
        // In-chunk cumulative log-decay.
        let mut gc = vec![0f32; l];
        let mut acc = 0f32;
        for (t, x) in ch.iter().enumerate() {
            acc += x.g;
            gc[t] = acc;
        }
        // M₀ᵀk_t and M₀ᵀq_t for every token of the chunk.
        let mt = |vec: &[f32]| -> Vec<f32> {
            let mut r = vec![0f32; s];
            for i in 0..s {
                for (rj, &mij) in r.iter_mut().zip(&mh[i * s..(i + 1) * s]) {
                    *rj += mij * vec[i];
                }
            }
            r
        };
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        // Forward substitution for δ.
        let mut delta = vec![0f32; l * s];
        for t in 0..l {
            let x = &ch[t];
            let mk = mt(x.k);
            let et = num.exp(gc[t]);
            let mut d: Vec<f32> = (0..s).map(|j| x.beta * (x.v[j] - et * mk[j])).collect();
            for i in 0..t {
                let a = x.beta * num.exp(gc[t] - gc[i]) * dot(x.k, ch[i].k);
                for j in 0..s {
                    d[j] -= a * delta[i * s + j];
                }
            }
            delta[t * s..(t + 1) * s].copy_from_slice(&d);
        }
        // Outputs.
        for t in 0..l {
            let x = &ch[t];
            let mq = mt(x.q);
            let et = num.exp(gc[t]);
            let o = &mut out[(ci * chunk + t) * s..(ci * chunk + t + 1) * s];
            for j in 0..s {
                o[j] = et * mq[j];
            }
            for i in 0..=t {
                let a = num.exp(gc[t] - gc[i]) * dot(x.q, ch[i].k);
                for j in 0..s {
                    o[j] += a * delta[i * s + j];
                }
            }
            o.iter_mut().for_each(|v| *v *= scale);
        }
        // Chunk-end state.
        let el = num.exp(gc[l - 1]);
        mh.iter_mut().for_each(|v| *v *= el);
        for i in 0..l {
            let w = num.exp(gc[l - 1] - gc[i]);
            let k = ch[i].k;
            for a in 0..s {
                let wk = w * k[a];
                for (mab, &db) in mh[a * s..(a + 1) * s].iter_mut().zip(&delta[i * s..(i + 1) * s]) {
                    *mab += wk * db;
                }
            }
        }
    }
    out
}
