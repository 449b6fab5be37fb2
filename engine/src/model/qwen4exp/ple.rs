//! PLE n-gram table block: hashes the current token and its predecessors into a large table of
//! embeddings (prime-sized per-head sub-tables), and writes a gated, convolved projection of
//! the gathered rows into every residual stream.
//!
//! ```text
//! context c_0 = tok_t, c_s = tok_{t−s} (s < N), EOS from the first missing or EOS predecessor on
//! h_n  = XOR_{j<n} (c_j · mult_j mod 2^64)              for n = 2..N
//! row_i = h_n mod vocab_i + offset_i                    head i = (n−2)·hpn + g
//! e     = concat_i table[row_i]                         [E], head-major
//! Kc[c] = rms((W_key e)[c]; γ_key[c]),  Q[c] = rms(R[c]; γ_query[c]),  val = W_value e
//! s_c   = Kc[c]·Q[c] / √E,  gate_c = σ(sign(s_c)·√max(|s_c|, 1e-6)),  Gv[c] = gate_c · val
//! Nn    = flatten_c rms(Gv[c]; γ_conv[c])
//! conv_t[ch] = silu(Σ_k w[ch,k] · Nn_{t−(Kp−1−k)·N}[ch])    depthwise, dilation N
//! R ← R + Gv + conv
//! ```
//! Table rows are dequantized exactly (Q8_0/Q5_0/Q5_1/IQ4_NL/F16/F32 via `quant`); the table may
//! live in another GGUF shard and is read by row through [`PleTable`] (direct I/O, mmap or RAM,
//! with a row cache).

use super::hparams::PleParams;
use super::linear::{Mat, rms_norm, sigmoid, silu};
use super::ple_io::PleTable;

/// Weights of the PLE block.
#[derive(Debug)]
pub struct Ple {
    pub params: PleParams,
    pub hc: usize,
    pub n_embd: usize,
    pub eps: f32,
    /// `per_layer_token_embd`: `[rows][Dp]`, read by row (see [`super::ple_io`]).
    pub table: PleTable,
    /// `[hc·E][E]`.
    pub key: Mat,
    /// `[E][E]`.
    pub value: Mat,
    /// `[hc][E]` each.
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// Conv taps `[hc·E][Kp]`.
    pub conv: Vec<f32>,
}

/// Per-sequence PLE state.
#[derive(Clone, Debug, PartialEq)]
pub struct PleState {
    /// The last N−1 token ids, oldest first (`None` before the sequence start).
    pub prev: Vec<Option<u32>>,
    /// The last (Kp−1)·N conv inputs `Nn`, oldest first, `[(Kp−1)·N][hc·E]`.
    pub hist: Vec<f32>,
}

impl Ple {
    pub fn new_state(&self) -> PleState {
        let p = &self.params;
        PleState {
            prev: vec![None; p.ngram - 1],
            hist: vec![0.0; (p.conv_kernel - 1) * p.ngram * self.hc * self.n_embd],
        }
    }

    /// Table rows of one token: `ctx[0]` is the token, `ctx[s]` its s-th predecessor (`None`
    /// when before the sequence start).
    pub fn rows(&self, ctx: &[Option<u32>]) -> Vec<u64> {
        let p = &self.params;
        let mut c = Vec::with_capacity(p.ngram);
        c.push(ctx[0].unwrap_or(p.eos) as u64);
        let mut cut = false;
        for s in 1..p.ngram {
            let tok = if cut {
                None
            } else {
                ctx.get(s).copied().flatten()
            };
            cut = cut || tok.is_none() || tok == Some(p.eos);
            c.push(if cut {
                p.eos as u64
            } else {
                tok.unwrap_or(p.eos) as u64
            });
        }
        let mut rows = Vec::with_capacity(p.n_heads());
        for n in 2..=p.ngram {
            let mut h = 0u64;
            for (j, &cj) in c.iter().enumerate().take(n) {
                h ^= cj.wrapping_mul(p.multipliers[j]);
            }
            for g in 0..p.heads_per_ngram {
                let i = (n - 2) * p.heads_per_ngram + g;
                rows.push(h % p.head_vocab_sizes[i] + p.head_offsets[i]);
            }
        }
        rows
    }

    /// Applies the block to the streams `r [n][hc][E]` of tokens `toks` (advancing `st`).
    /// Returns an error message naming the row if a hashed row is outside the table.
    pub fn forward(&self, r: &mut [f32], toks: &[u32], st: &mut PleState) -> Result<(), String> {
        let p = &self.params;
        let (hc, e, n) = (self.hc, self.n_embd, toks.len());
        let hce = hc * e;
        let dp = p.head_dim;
        // Gather the n-gram rows (one batched table read: the file source reads the rows of
        // the whole batch in parallel). Heads are contiguous: n_heads · Dp = E.
        let mut rows = Vec::with_capacity(n * p.n_heads());
        for t in 0..n {
            let mut ctx = vec![Some(toks[t])];
            for s in 1..p.ngram {
                ctx.push(if t >= s {
                    Some(toks[t - s])
                } else {
                    st.prev[p.ngram - 1 - (s - t)]
                });
            }
            for (i, row) in self.rows(&ctx).into_iter().enumerate() {
                if row >= self.table.rows as u64 {
                    return Err(format!(
                        "PLE row {row} (head {i}) outside the table of {} rows",
                        self.table.rows
                    ));
                }
                rows.push(row as usize);
            }
        }
        let mut emb = vec![0f32; n * e];
        if p.n_heads() * dp == e {
            self.table.get_rows(&rows, &mut emb)?;
        } else {
            for (k, &row) in rows.iter().enumerate() {
                let (t, i) = (k / p.n_heads(), k % p.n_heads());
                self.table
                    .get_row(row, &mut emb[t * e + i * dp..t * e + (i + 1) * dp])?;
            }
        }
        for &tok in toks {
            st.prev.remove(0);
            st.prev.push(Some(tok));
        }

        let mut key = vec![0f32; n * hce];
        self.key.matmul(&emb, n, &mut key);
        let mut val = vec![0f32; n * e];
        self.value.matmul(&emb, n, &mut val);
        let inv_sqrt_e = 1.0 / (e as f32).sqrt();
        let mut gv = vec![0f32; n * hce];
        let mut nn = vec![0f32; n * hce];
        let (mut kc, mut qc) = (vec![0f32; e], vec![0f32; e]);
        for t in 0..n {
            for c in 0..hc {
                let o = t * hce + c * e;
                let g = &self.norm_key[c * e..(c + 1) * e];
                rms_norm(&key[o..o + e], Some(g), self.eps, &mut kc);
                rms_norm(
                    &r[o..o + e],
                    Some(&self.norm_query[c * e..(c + 1) * e]),
                    self.eps,
                    &mut qc,
                );
                let s = kc.iter().zip(&qc).map(|(a, b)| a * b).sum::<f32>() * inv_sqrt_e;
                let sign = if s > 0.0 {
                    1.0
                } else if s < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let gate = sigmoid(sign * s.abs().max(1e-6).sqrt());
                for (gvv, &vv) in gv[o..o + e].iter_mut().zip(&val[t * e..(t + 1) * e]) {
                    *gvv = gate * vv;
                }
                rms_norm(
                    &gv[o..o + e],
                    Some(&self.norm_conv[c * e..(c + 1) * e]),
                    self.eps,
                    &mut nn[o..o + e],
                );
            }
        }

        // Dilated causal depthwise conv over [history | new].
        let (kp, dil) = (p.conv_kernel, p.ngram);
        let hlen = (kp - 1) * dil;
        let mut all = Vec::with_capacity((hlen + n) * hce);
        all.extend_from_slice(&st.hist);
        all.extend_from_slice(&nn);
        for t in 0..n {
            for ch in 0..hce {
                let mut acc = 0f32;
                for k in 0..kp {
                    acc += self.conv[ch * kp + k] * all[(hlen + t - (kp - 1 - k) * dil) * hce + ch];
                }
                let o = t * hce + ch;
                r[o] = (r[o] + gv[o]) + silu(acc);
            }
        }
        st.hist.copy_from_slice(&all[n * hce..]);
        Ok(())
    }
}
