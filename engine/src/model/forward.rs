//! The decoder forward pass, written once for every supported architecture.
//!
//! Tokens are processed in chunks of `prefill_chunk` rows: every projection is one
//! `cpu_kernels::matmul` over the chunk (a `matvec` for single-token decode), attention reads the
//! per-sequence KV cache. Scratch buffers live in the [`Session`] and only grow, so steady-state
//! decoding allocates nothing.

use cpu_kernels as ck;

use super::{Ffn, LayerKind, Model, RopeKind, W};
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvCache, KvType, LayerCache};

/// Which positions of an evaluation produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (perplexity, `strata logits`).
    All,
}

/// Per-sequence state: KV cache, position, and reusable scratch buffers.
pub struct Session {
    pub cache: KvCache,
    /// Number of positions already in the cache.
    pub n_past: usize,
    /// Maximum rows per forward chunk (`--prefill`).
    pub prefill_chunk: usize,
    /// When set, the residual stream after every layer of the next forward chunk is copied
    /// here (`[layer][tokens * n_embd]`; backend parity tests).
    pub trace: Option<Vec<Vec<f32>>>,
    /// Attention in the fixed float order of `attention::attend_ordered`, the order the GPU's
    /// ordered mode uses, so both backends compute it bit for bit alike (`--ordered-attention`).
    pub ordered_attention: bool,
    /// Ordered-numerics mode (`--ordered`): besides ordered attention, every matrix product is
    /// [`matmul_ordered`] (the `quant` crate's reference quantizer and `vec_dot`, the code the
    /// GPU's `mmv_ordered` kernel runs per output), SiLU / non-Gemma GELU use `quant::fmath`,
    /// and MoE routing/combining follow the GPU kernels' order. With `GpuOptions::ordered` the
    /// GPU backend computes every layer and the logits bit for bit alike. Slower.
    pub ordered: bool,
    s: Scratch,
}

/// Rope angles of one chunk: ((base bits, scale bits, pos0, n), `[n][rot/2]` (cos, sin)).
type RopeCs = ((u32, u32, usize, usize), Vec<(f32, f32)>);

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    head: Vec<f32>,
    /// ggml rope angles of the current chunk: ((base bits, scale bits, pos0, n), [n][rot/2]).
    rope_cs: Vec<RopeCs>,
    pub(crate) moe: super::moe::MoeScratch,
}

/// Grows `v` to at least `n` elements (never shrinks: no steady-state allocation).
#[inline]
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl Session {
    /// Forgets the sequence (the cache contents are overwritten by the next evaluation).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }
    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }
}

impl Model {
    /// A fresh sequence with room for `max_ctx` positions.
    pub fn new_session(&self, kv: KvType, max_ctx: usize, prefill_chunk: usize) -> Session {
        Session {
            cache: KvCache::new(kv, max_ctx, &self.cache_shape()),
            n_past: 0,
            prefill_chunk: prefill_chunk.max(1),
            trace: None,
            ordered_attention: false,
            ordered: false,
            s: Scratch::default(),
        }
    }

    /// `y[n][rows] = x[n][cols] W^T` (expert `e` of a stack).
    #[inline]
    pub(crate) fn mm(&self, w: &W, e: usize, x: &[f32], n: usize, y: &mut [f32]) {
        let t = self.qt(w, e);
        let (x, y) = (&x[..n * w.cols], &mut y[..n * w.rows]);
        if ggml_exact(&self.hp) {
            ck::matmul_ggml(&t, x, n, y)
        } else if n == 1 {
            ck::matvec(&t, x, y)
        } else {
            ck::matmul(&t, x, n, y)
        }
    }

    /// [`Self::mm`], or [`matmul_ordered`] in the ordered-numerics mode.
    #[inline]
    pub(crate) fn mm_o(&self, ordered: bool, w: &W, e: usize, x: &[f32], n: usize, y: &mut [f32]) {
        if !ordered {
            return self.mm(w, e, x, n, y);
        }
        let t = self.qt(w, e);
        if let Err(err) = matmul_ordered(&t, &x[..n * w.cols], n, &mut y[..n * w.rows]) {
            panic!("matmul_ordered {:?} {}x{} n={n}: {err}", t.ty, t.rows, t.cols);
        }
    }

    /// Exact-path ([`ggml_exact`]) products of the same activations with several matrices in
    /// one parallel region (`cpu_kernels::try_matmul_ggml_multi`; same bits as [`Self::mm`]).
    fn mm_multi<const K: usize>(&self, x: &[f32], n: usize, jobs: [(&W, &mut [f32]); K]) {
        let ts: Vec<ck::QTensor> = jobs.iter().map(|(w, _)| self.qt(w, 0)).collect();
        let mut ys: Vec<&mut [f32]> = jobs.into_iter().zip(&ts).map(|((_, y), t)| &mut y[..n * t.rows]).collect();
        let cols = ts[0].cols;
        if let Err(e) = ck::try_matmul_ggml_multi(&ts, &x[..n * cols], n, &mut ys) {
            panic!("matmul_ggml_multi n={n}: {e}");
        }
    }

    /// Appends `tokens` to the sequence and writes logits to `out`
    /// (`[1][vocab]` for [`Logits::Last`], `[tokens.len()][vocab]` for [`Logits::All`]).
    pub fn eval(&self, s: &mut Session, tokens: &[u32], want: Logits, out: &mut Vec<f32>) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(EngineError::BadToken { id, vocab: self.n_vocab });
        }
        let needed = s.n_past + tokens.len();
        if needed > s.cache.capacity {
            return Err(EngineError::ContextFull { needed, capacity: s.cache.capacity });
        }
        let nv = self.n_vocab;
        let rows = if want == Logits::All { tokens.len() } else { 1 };
        if out.len() != rows * nv {
            out.resize(rows * nv, 0.0);
        }
        let chunk = s.prefill_chunk;
        let n_chunks = tokens.len().div_ceil(chunk);
        for (ci, toks) in tokens.chunks(chunk).enumerate() {
            let last = ci + 1 == n_chunks;
            let dst = match want {
                Logits::All => Some(&mut out[ci * chunk * nv..(ci * chunk + toks.len()) * nv]),
                Logits::Last if last => Some(&mut out[..]),
                Logits::Last => None,
            };
            self.forward_chunk(s, toks, want, dst);
            s.n_past += toks.len();
        }
        Ok(())
    }

    fn forward_chunk(&self, sess: &mut Session, toks: &[u32], want: Logits, logits: Option<&mut [f32]>) {
        let hp = &self.hp;
        let n = toks.len();
        let (d, hd, nh, nkv) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv);
        let (nq, nk) = (nh * hd, nkv * hd);
        let pos0 = sess.n_past;
        let ordered = sess.ordered;
        let ordered_attention = sess.ordered_attention || ordered;
        let mut trace = sess.trace.take();
        if let Some(t) = trace.as_mut() {
            t.clear();
        }
        let s = &mut sess.s;
        let exact = ggml_exact(hp);
        let norm: fn(&[f32], &[f32], f32, &mut [f32]) = if exact { ck::rms_norm_ggml } else { ck::rms_norm };
        let ff = match &hp.moe {
            Some(m) => m.n_ff_exp,
            None => hp.n_ff,
        };
        grow(&mut s.x, n * d);
        grow(&mut s.xn, n * d.max(nq));
        grow(&mut s.q, n * nq);
        grow(&mut s.k, n * nk);
        grow(&mut s.v, n * nk);
        grow(&mut s.att, n * nq);
        grow(&mut s.o, n * d);
        grow(&mut s.gate, n * ff);
        grow(&mut s.up, n * ff);
        grow(&mut s.head, hd);

        // Embeddings.
        let emb = self.qt(&self.tok_embd, 0);
        for (i, &t) in toks.iter().enumerate() {
            let row = &mut s.x[i * d..(i + 1) * d];
            ck::get_row(&emb, t as usize, row);
            if let Some(sc) = hp.embd_scale {
                row.iter_mut().for_each(|v| *v *= sc);
            }
        }

        for (il, lw) in self.layers.iter().enumerate() {
            let LayerKind::Attention(spec) = &hp.layers[il];
            let LayerCache::Attention(kv) = &mut sess.cache.layers[il];
            let a = &lw.attn;

            // Attention block.
            norm_rows(norm, &s.x[..n * d], &a.norm, hp.rms_eps, &mut s.xn[..n * d], d);
            if exact && !ordered {
                self.mm_multi(&s.xn, n, [(&a.wq, &mut s.q[..]), (&a.wk, &mut s.k[..]), (&a.wv, &mut s.v[..])]);
            } else {
                self.mm_o(ordered, &a.wq, 0, &s.xn, n, &mut s.q);
                self.mm_o(ordered, &a.wk, 0, &s.xn, n, &mut s.k);
                self.mm_o(ordered, &a.wv, 0, &s.xn, n, &mut s.v);
            }
            for (buf, b, w) in [(&mut s.q, &a.bq, nq), (&mut s.k, &a.bk, nk), (&mut s.v, &a.bv, nk)] {
                if let Some(b) = b {
                    for row in buf[..n * w].chunks_exact_mut(w) {
                        row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    }
                }
            }
            for (buf, nrm, w) in [(&mut s.q, &a.q_norm, nq), (&mut s.k, &a.k_norm, nk)] {
                if let Some(nrm) = nrm {
                    norm_rows_inplace(norm, &mut buf[..n * w], nrm, hp.rms_eps, hd);
                }
            }
            // ggml rope angles: once per (position, base, scale) for the whole chunk.
            let cs_key = (spec.rope_base.to_bits(), spec.rope_scale.to_bits(), pos0, n);
            let cs_half = hp.rope_dim.min(hd) / 2;
            if exact && matches!(hp.rope, RopeKind::Neox) && !s.rope_cs.iter().any(|(k, _)| *k == cs_key) {
                let mut t = Vec::with_capacity(n * cs_half);
                for i in 0..n {
                    ck::rope_cs_ggml(hp.rope_dim.min(hd), pos0 + i, spec.rope_base, spec.rope_scale, &mut t);
                }
                s.rope_cs.retain(|(k, _)| k.2 == pos0 && k.3 == n);
                s.rope_cs.push((cs_key, t));
            }
            let cs_all = s.rope_cs.iter().find(|(k, _)| *k == cs_key).map(|(_, t)| t.as_slice());
            for i in 0..n {
                let pos = pos0 + i;
                let (q, k) = (&mut s.q[i * nq..(i + 1) * nq], &mut s.k[i * nk..(i + 1) * nk]);
                if let (true, RopeKind::Neox, Some(cs_all)) = (exact, hp.rope, cs_all) {
                    let cs = &cs_all[i * cs_half..(i + 1) * cs_half];
                    ck::rope_neox_ggml_cs(q, nh, hd, cs);
                    ck::rope_neox_ggml_cs(k, nkv, hd, cs);
                } else {
                    let rope: fn(&mut [f32], usize, usize, usize, usize, f32, f32) = match hp.rope {
                        RopeKind::Neox if exact => ck::rope_neox_ggml,
                        RopeKind::Neox => ck::rope_neox,
                        RopeKind::Norm => ck::rope_norm,
                    };
                    rope(q, nh, hd, hp.rope_dim, pos, spec.rope_base, spec.rope_scale);
                    rope(k, nkv, hd, hp.rope_dim, pos, spec.rope_base, spec.rope_scale);
                }
                if hp.q_scale != 1.0 {
                    q.iter_mut().for_each(|v| *v *= hp.q_scale);
                }
                kv.write(pos, k, &s.v[i * nk..(i + 1) * nk]);
            }
            let shape = super::attention::Shape {
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                pos0,
                window: spec.window,
                kq_scale: hp.kq_scale,
                ggml_exact: exact,
            };
            if ordered_attention {
                super::attention::attend_ordered(kv, &s.q[..n * nq], &mut s.att[..n * nq], shape);
            } else {
                super::attention::attend(kv, &s.q[..n * nq], &mut s.att[..n * nq], shape);
            }
            self.mm_o(ordered, &a.wo, 0, &s.att, n, &mut s.o);
            add_residual(&mut s.x[..n * d], &s.o[..n * d], a.post_norm.as_deref(), hp.rms_eps, &mut s.xn, d, norm);

            // FFN block.
            let f = &lw.ffn;
            norm_rows(norm, &s.x[..n * d], &f.norm, hp.rms_eps, &mut s.xn[..n * d], d);
            match &f.ffn {
                Ffn::Dense { gate, up, down } => {
                    if exact && !ordered {
                        self.mm_multi(&s.xn, n, [(gate, &mut s.gate[..]), (up, &mut s.up[..])]);
                    } else {
                        self.mm_o(ordered, gate, 0, &s.xn, n, &mut s.gate);
                        self.mm_o(ordered, up, 0, &s.xn, n, &mut s.up);
                    }
                    let (g, u) = (&mut s.gate[..n * ff], &s.up[..n * ff]);
                    // Activation in place into `gate` (kernels take distinct in/out slices: use `att`).
                    grow(&mut s.att, n * ff);
                    let act = &mut s.att[..n * ff];
                    match hp.act {
                        super::Act::Silu if ordered => glu_fmath(quant::fmath::silu, g, u, act),
                        super::Act::Silu => ck::swiglu(g, u, act),
                        // The GPU's ordered mode uploads this f16 table (`geglu_table_f32`).
                        super::Act::GeluTanh if exact => par_elementwise(ck::geglu_ggml, g, u, act),
                        super::Act::GeluTanh if ordered => glu_fmath(quant::fmath::gelu_tanh, g, u, act),
                        super::Act::GeluTanh => ck::geglu(g, u, act),
                    }
                    self.mm_o(ordered, down, 0, act, n, &mut s.o);
                }
                Ffn::Moe { router, gate, up, down } => {
                    let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
                    super::moe::moe_ffn(self, spec, [router, gate, up, down], &s.xn[..n * d], n, &mut s.o[..n * d], &mut s.moe, ordered);
                }
            }
            add_residual(&mut s.x[..n * d], &s.o[..n * d], f.post_norm.as_deref(), hp.rms_eps, &mut s.xn, d, norm);
            if let Some(t) = trace.as_mut() {
                t.push(s.x[..n * d].to_vec());
            }
        }
        sess.trace = trace;

        // Output head on the rows that need logits.
        if let Some(logits) = logits {
            let first = if want == Logits::All { 0 } else { n - 1 };
            let m = n - first;
            for (j, i) in (first..n).enumerate() {
                norm(&s.x[i * d..(i + 1) * d], &self.output_norm, hp.rms_eps, &mut s.xn[j * d..(j + 1) * d]);
            }
            self.mm_o(ordered, &self.output, 0, &s.xn, m, logits);
        }
    }
}

/// Whether the forward pass copies llama.cpp's CPU rounding bit for bit (ggml-order matmul
/// kernels, x86 Q8_0 activation rounding, f16 GELU table, ggml rope/RMS norm/attention).
/// Gemma 3 needs it: its residual stream has outliers large enough that a one-ulp difference
/// flips a later Q8 activation quant and moves logits by ~0.1 (measured: our own AVX-512 vs
/// portable kernels differ by 0.09-0.2 mean |logit| on prompt 1). With it, prompt 1's last
/// logits equal llama.cpp's exactly. The exact kernels are slower, so other models keep the
/// fast ones (they match llama.cpp without it).
pub(crate) fn ggml_exact(hp: &super::HParams) -> bool {
    hp.arch == super::Arch::Gemma3
}

/// `y[n][rows] = x[n][cols] · Wᵀ` in the ordered-numerics mode: each column of `x` quantized
/// to `w.ty.vec_dot_type()` by `quant::quantize_row` (the reference quantizer), each output
/// `quant::vec_dot` of a weight row with a column (integer sums inside blocks, f32 — F32/F16/
/// BF16: f64 — accumulation across blocks in order). The GPU's `quantize_ref` + `mmv_ordered`
/// kernels run this very code per block / per output, so the two agree bit for bit. Rows are
/// split over rayon (the order inside a dot is fixed).
pub fn matmul_ordered(w: &ck::QTensor, x: &[f32], n: usize, y: &mut [f32]) -> std::result::Result<(), String> {
    use rayon::prelude::*;
    let (k, rows, at) = (w.cols, w.rows, w.ty.vec_dot_type());
    let (Some(rb), Some(ab)) = (w.ty.row_bytes(k), at.row_bytes(k)) else {
        return Err(format!("{} rows of {k} (not a whole number of blocks)", w.ty.name()));
    };
    if !w.ty.has_reference() {
        return Err(format!("{} has no reference dot product", w.ty.name()));
    }
    if x.len() < n * k || y.len() < n * rows || w.data.len() < rows * rb {
        return Err(format!("shapes: x {} (need {}), y {} (need {}), weights {} bytes (need {})", x.len(), n * k, y.len(), n * rows, w.data.len(), rows * rb));
    }
    let mut acts = vec![0u8; n * ab];
    for (c, a) in acts.chunks_exact_mut(ab).enumerate() {
        quant::quantize_row(at, &x[c * k..(c + 1) * k], a).map_err(|e| format!("{e:?}"))?;
    }
    // Row-major results (rows split over the pool), then transposed to [n][rows].
    let mut t = vec![0f32; rows * n];
    const ROWS_PER_TASK: usize = 16;
    t.par_chunks_mut(ROWS_PER_TASK * n).enumerate().for_each(|(i, ch)| {
        for (j, out) in ch.chunks_exact_mut(n).enumerate() {
            let r = i * ROWS_PER_TASK + j;
            let wr = &w.data[r * rb..(r + 1) * rb];
            for (c, o) in out.iter_mut().enumerate() {
                *o = quant::vec_dot(w.ty, k, wr, &acts[c * ab..(c + 1) * ab]).unwrap_or(f32::NAN);
            }
        }
    });
    for r in 0..rows {
        for c in 0..n {
            y[c * rows + r] = t[r * n + c];
        }
    }
    Ok(())
}

/// `out[i] = act(gate[i]) * up[i]` with a `quant::fmath` activation (the GPU's `glu_f32`).
fn glu_fmath(act: fn(f32) -> f32, gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = act(g) * u;
    }
}

/// Rows at which the per-row helpers below go parallel.
const PAR_ROWS: usize = 16;

/// `out[r] = norm(x[r])` for rows of `d` values (rayon over rows for large batches).
fn norm_rows(norm: fn(&[f32], &[f32], f32, &mut [f32]), x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    use rayon::prelude::*;
    if x.len() / d >= PAR_ROWS {
        out.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(o, xr)| norm(xr, w, eps, o));
    } else {
        out.chunks_mut(d).zip(x.chunks(d)).for_each(|(o, xr)| norm(xr, w, eps, o));
    }
}

/// `x[r] = norm(x[r])` in place for rows of `d` values (one row of scratch per task).
fn norm_rows_inplace(norm: fn(&[f32], &[f32], f32, &mut [f32]), x: &mut [f32], w: &[f32], eps: f32, d: usize) {
    use rayon::prelude::*;
    let one = |xr: &mut [f32], tmp: &mut Vec<f32>| {
        tmp.clear();
        tmp.extend_from_slice(xr);
        norm(tmp, w, eps, xr);
    };
    if x.len() / d >= PAR_ROWS {
        x.par_chunks_mut(d).for_each_with(Vec::with_capacity(d), |tmp, xr| one(xr, tmp));
    } else {
        let mut tmp = Vec::with_capacity(d);
        x.chunks_mut(d).for_each(|xr| one(xr, &mut tmp));
    }
}

/// An element-wise `f(a, b, out)` split over rayon for large inputs.
fn par_elementwise(f: fn(&[f32], &[f32], &mut [f32]), a: &[f32], b: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 16 << 10;
    if out.len() >= 4 * CHUNK {
        out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(o, (a, b))| f(a, b, o));
    } else {
        f(a, b, out)
    }
}

/// `x += post_norm(o)` (or `x += o`), row by row; `tmp` holds at least one row.
fn add_residual(
    x: &mut [f32],
    o: &[f32],
    post_norm: Option<&[f32]>,
    eps: f32,
    tmp: &mut [f32],
    d: usize,
    rms_norm: fn(&[f32], &[f32], f32, &mut [f32]),
) {
    match post_norm {
        Some(w) if x.len() / d >= PAR_ROWS => {
            use rayon::prelude::*;
            x.par_chunks_exact_mut(d).zip(o.par_chunks_exact(d)).for_each_with(vec![0f32; d], |tmp, (xr, or)| {
                rms_norm(or, w, eps, tmp);
                xr.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
            });
        }
        Some(w) => {
            for (xr, or) in x.chunks_exact_mut(d).zip(o.chunks_exact(d)) {
                rms_norm(or, w, eps, &mut tmp[..d]);
                xr.iter_mut().zip(&tmp[..d]).for_each(|(a, b)| *a += b);
            }
        }
        None => x.iter_mut().zip(o).for_each(|(a, b)| *a += b),
    }
}

