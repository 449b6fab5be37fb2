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
use super::ple_io::{ParFor, PleTable};
use crate::Mat;

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
            let tok = if cut { None } else { ctx.get(s).copied().flatten() };
            cut = cut || tok.is_none() || tok == Some(p.eos);
            c.push(if cut { p.eos as u64 } else { tok.unwrap_or(p.eos) as u64 });
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

    /// The table rows of `toks` (its n-gram contexts continue `st.prev`), `[n][E]` with the
    /// heads contiguous, read as one batch (the file source reads them in parallel through
    /// `par`); advances `st.prev`. Both backends start the block here (the device then runs
    /// the rest). An error names a hashed row outside the table.
    pub fn gather(&self, toks: &[u32], st: &mut PleState, par: ParFor) -> Result<Vec<f32>, String> {
        let rows = self.row_ids(toks, st)?;
        self.read_rows(&rows, par)
    }

    /// The first half of [`Ple::gather`]: the hashed table rows of `toks`, `[n][heads]`
    /// (cheap); advances `st.prev`. An error names a row outside the table.
    pub fn row_ids(&self, toks: &[u32], st: &mut PleState) -> Result<Vec<usize>, String> {
        let p = &self.params;
        let mut rows = Vec::with_capacity(toks.len() * p.n_heads());
        for t in 0..toks.len() {
            let mut ctx = vec![Some(toks[t])];
            for s in 1..p.ngram {
                ctx.push(if t >= s { Some(toks[t - s]) } else { st.prev[p.ngram - 1 - (s - t)] });
            }
            for (i, row) in self.rows(&ctx).into_iter().enumerate() {
                if row >= self.table.rows as u64 {
                    return Err(format!("PLE row {row} (head {i}) outside the table of {} rows", self.table.rows));
                }
                rows.push(row as usize);
            }
        }
        for &tok in toks {
            st.prev.remove(0);
            st.prev.push(Some(tok));
        }
        Ok(rows)
    }

    /// The second half of [`Ple::gather`]: reads `rows` (from [`Ple::row_ids`]) from the table
    /// (row cache, SSD; rows not cached read in parallel through `par`), `[n][E]` with the
    /// heads contiguous. Takes `&self` only, so a thread can read while another runs the device.
    pub fn read_rows(&self, rows: &[usize], par: ParFor) -> Result<Vec<f32>, String> {
        let p = &self.params;
        let (e, dp) = (self.n_embd, p.head_dim);
        let n = rows.len() / p.n_heads().max(1);
        let mut emb = vec![0f32; n * e];
        if p.n_heads() * dp == e {
            self.table.get_rows(rows, &mut emb, par)?;
        } else {
            for (k, &row) in rows.iter().enumerate() {
                let (t, i) = (k / p.n_heads(), k % p.n_heads());
                self.table.get_row(row, &mut emb[t * e + i * dp..t * e + (i + 1) * dp])?;
            }
        }
        Ok(emb)
    }
}
