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
//! by GPU kernels). The two agree to f32 rounding (tests/models_qwen4exp.rs).


use super::linear::{Mat, rms_norm, sigmoid, silu, softplus};

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

/// Per-token inputs of the delta rule for one value head.
struct HeadIn<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: f32,
    beta: f32,
}

impl Gdn {
    /// Conv channels C = 2·Hk·S + Hv·S.
    pub fn channels(&self) -> usize {
        (2 * self.hk + self.hv) * self.s
    }

    pub fn new_state(&self) -> GdnState {
        GdnState {
            conv: vec![0.0; (self.conv_k - 1) * self.channels()],
            m: vec![0.0; self.hv * self.s * self.s],
        }
    }

    /// Runs `n` tokens `x [n][E]`, advancing `st`; writes `y [n][E]`.
    pub fn forward(&self, x: &[f32], n: usize, st: &mut GdnState, mode: GdnMode, y: &mut [f32]) {
        let (c, hv, vd) = (self.channels(), self.hv, self.hv * self.s);
        let mut m = vec![0f32; n * c];
        self.qkv.matmul(x, n, &mut m);
        let mut z = vec![0f32; n * vd];
        self.gate.matmul(x, n, &mut z);
        let mut beta = vec![0f32; n * hv];
        self.beta.matmul(x, n, &mut beta);
        let mut alpha = vec![0f32; n * hv];
        self.alpha.matmul(x, n, &mut alpha);
        let o = self.mix(&m, &z, &beta, &alpha, n, st, mode);
        self.out.matmul(&o, n, y);
    }

    /// The token mixer between the projections, what the GPU's `gdn_*` kernels compute: conv
    /// inputs `m [n][C]`, gate `z [n][Hv·S]`, β and α logits `[n][Hv]`; returns the gated,
    /// normalised head outputs `o [n][Hv·S]` (the input of `ssm_out`), advancing `st`.
    #[allow(clippy::too_many_arguments)]
    pub fn mix(
        &self,
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
        let beta: Vec<f32> = beta_logit[..n * hv].iter().map(|&b| sigmoid(b)).collect();
        let mut g = alpha_logit[..n * hv].to_vec();
        for t in 0..n {
            for h in 0..hv {
                let v = &mut g[t * hv + h];
                *v = softplus(*v + self.dt_bias[h]) * self.a[h];
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
                u[t * c + ch] = silu(acc);
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
                GdnMode::Recurrent => recurrent(mh, s, &inputs),
                GdnMode::Chunked(cs) => chunked(mh, s, &inputs, cs.max(1)),
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
                    *ov = nv * sigmoid(zv);
                }
            }
        }
        o
    }
}

/// Token-by-token delta rule for one head; returns `o [n][S]`, updates `mh [S][S]`.
fn recurrent(mh: &mut [f32], s: usize, inputs: &[HeadIn]) -> Vec<f32> {
    let scale = 1.0 / (s as f32).sqrt();
    let mut out = vec![0f32; inputs.len() * s];
    let mut kv = vec![0f32; s];
    for (t, x) in inputs.iter().enumerate() {
        let decay = x.g.exp();
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
fn chunked(mh: &mut [f32], s: usize, inputs: &[HeadIn], chunk: usize) -> Vec<f32> {
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
            let et = gc[t].exp();
            let mut d: Vec<f32> = (0..s).map(|j| x.beta * (x.v[j] - et * mk[j])).collect();
            for i in 0..t {
                let a = x.beta * (gc[t] - gc[i]).exp() * dot(x.k, ch[i].k);
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
            let et = gc[t].exp();
            let o = &mut out[(ci * chunk + t) * s..(ci * chunk + t + 1) * s];
            for j in 0..s {
                o[j] = et * mq[j];
            }
            for i in 0..=t {
                let a = (gc[t] - gc[i]).exp() * dot(x.q, ch[i].k);
                for j in 0..s {
                    o[j] += a * delta[i * s + j];
                }
            }
            o.iter_mut().for_each(|v| *v *= scale);
        }
        // Chunk-end state.
        let el = gc[l - 1].exp();
        mh.iter_mut().for_each(|v| *v *= el);
        for i in 0..l {
            let w = (gc[l - 1] - gc[i]).exp();
            let k = ch[i].k;
            for a in 0..s {
                let wk = w * k[a];
                for (mab, &db) in mh[a * s..(a + 1) * s]
                    .iter_mut()
                    .zip(&delta[i * s..(i + 1) * s])
                {
                    *mab += wk * db;
                }
            }
        }
    }
    out
}
