//! The decoder's operations ([`DecoderOps`]) on the host, for one chunk of tokens.
//!
//! Numerics: for architectures with `Arch::ggml_exact` (Gemma 3) every operation copies
//! llama.cpp's CPU float order; with `ordered` (`--ordered`) they are the GPU ordered mode's
//! (`matmul_ordered`, `quant::fmath` activations, ordered attention and MoE combine).

use std::mem::take;

use cpu_kernels as ck;

use super::matmul::{add_residual, glu_fmath, norm_rows, norm_rows_inplace, par_elementwise};
use super::{Scratch, grow};
use crate::kv_cache::{KvCache, LayerCache};
use crate::{DecoderMatmul, MatCpu, Numerics};
use model::decoder::{Block, Buf, DecoderOps};
use model::error::EngineError;
use model::{Act, AttnSpec, Decoder, Mat, MoeSpec, RopeKind};

type Norm = fn(&[f32], &[f32], f32, &mut [f32]);

/// One chunk of a CPU session: the model, the session's scratch and cache, the tokens.
pub(super) struct CpuChunk<'a> {
    pub m: &'a Decoder,
    pub s: &'a mut Scratch,
    pub cache: &'a mut KvCache,
    pub toks: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
    pub ordered: bool,
    pub ordered_attention: bool,
    /// `--cpu-gemm tiles` (`Session::tiles`).
    pub tiles: bool,
    /// The residual after every layer is pushed here when tracing.
    pub trace: Option<&'a mut Vec<Vec<f32>>>,
    /// Logits of the rows [`DecoderOps::head`] is asked for.
    pub logits: Option<&'a mut [f32]>,
}

impl CpuChunk<'_> {
    fn n(&self) -> usize {
        self.toks.len()
    }
    fn exact(&self) -> bool {
        self.m.hp.arch.ggml_exact()
    }
    fn kernels(&self) -> Numerics {
        Numerics::of(self.ordered, self.tiles)
    }
    fn norm_fn(&self) -> Norm {
        if self.exact() { ck::rms_norm_ggml } else { ck::rms_norm }
    }
    fn buf(&mut self, b: Buf) -> &mut Vec<f32> {
        let s = &mut *self.s;
        match b {
            Buf::X => &mut s.x,
            Buf::Xn => &mut s.xn,
            Buf::Q => &mut s.q,
            Buf::K => &mut s.k,
            Buf::V => &mut s.v,
            Buf::Att => &mut s.att,
            Buf::O => &mut s.o,
            Buf::Act => &mut s.act,
        }
    }
    /// Runs `f` with `src` moved out of the scratch (so other buffers can be borrowed
    /// mutably at the same time), then puts it back.
    fn with_src<R>(&mut self, src: Buf, f: impl FnOnce(&mut Self, &[f32]) -> R) -> R {
        let x = take(self.buf(src));
        let r = f(self, &x);
        *self.buf(src) = x;
        r
    }
    /// Numerics of `x` with several matrices: one parallel region on the exact path (same
    /// bits as one product at a time), else one product each.
    fn products(&mut self, x: &[f32], outs: &mut [(&Mat, &mut Vec<f32>)]) {
        let (m, n, p) = (self.m, self.n(), self.kernels());
        if p != Numerics::Ordered {
            match outs {
                [(a, ya), (b, yb)] => return m.mm_multi(p, x, n, [(*a, &mut ya[..]), (*b, &mut yb[..])]),
                [(a, ya), (b, yb), (c, yc)] => {
                    return m.mm_multi(p, x, n, [(*a, &mut ya[..]), (*b, &mut yb[..]), (*c, &mut yc[..])]);
                }
                _ => {}
            }
        }
        for (w, y) in outs.iter_mut() {
            m.mm(p, w, 0, x, n, &mut y[..]);
        }
    }
}

impl DecoderOps for CpuChunk<'_> {
    type Mat = Mat;
    type Vector = Vec<f32>;
    type Error = EngineError;

    fn embed(&mut self, tok_embd: &Mat, scale: Option<f32>) -> Result<(), EngineError> {
        let d = self.m.hp.n_embd;
        let emb = tok_embd.qt();
        for (i, &t) in self.toks.iter().enumerate() {
            let row = &mut self.s.x[i * d..(i + 1) * d];
            ck::get_row(&emb, t as usize, row);
            if let Some(sc) = scale {
                row.iter_mut().for_each(|v| *v *= sc);
            }
        }
        Ok(())
    }

    fn norm(&mut self, src: Buf, w: &Vec<f32>, dst: Buf) -> Result<(), EngineError> {
        let (d, n, eps, norm) = (self.m.hp.n_embd, self.n(), self.m.hp.rms_eps, self.norm_fn());
        self.with_src(src, |c, x| norm_rows(norm, &x[..n * d], w, eps, &mut c.buf(dst)[..n * d], d));
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, w: &Vec<f32>, heads: usize) -> Result<(), EngineError> {
        let (hd, n, eps, norm) = (self.m.hp.head_dim, self.n(), self.m.hp.rms_eps, self.norm_fn());
        norm_rows_inplace(norm, &mut self.buf(buf)[..n * heads * hd], w, eps, hd);
        Ok(())
    }

    fn project(&mut self, src: Buf, outs: &[(&Mat, Buf)]) -> Result<(), EngineError> {
        let mut ys: Vec<(&Mat, Vec<f32>)> = outs.iter().map(|&(w, b)| (w, take(self.buf(b)))).collect();
        self.with_src(src, |c, x| {
            let mut refs: Vec<(&Mat, &mut Vec<f32>)> = ys.iter_mut().map(|(w, y)| (*w, y)).collect();
            c.products(x, &mut refs);
        });
        for ((_, b), (_, y)) in outs.iter().zip(ys) {
            *self.buf(*b) = y;
        }
        Ok(())
    }

    fn add_bias(&mut self, buf: Buf, b: &Vec<f32>) -> Result<(), EngineError> {
        let n = self.n();
        for row in self.buf(buf)[..n * b.len()].chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        }
        Ok(())
    }

    fn rope(&mut self, buf: Buf, heads: usize, spec: &AttnSpec) -> Result<(), EngineError> {
        let hp = &self.m.hp;
        let (n, hd, pos0, exact) = (self.n(), hp.head_dim, self.pos0, self.exact());
        let width = heads * hd;
        // ggml rope angles: once per (position, base, scale) for the whole chunk (Q and K).
        let cs_key = (spec.rope_base.to_bits(), spec.rope_scale.to_bits(), pos0, n);
        let cs_half = hp.rope_dim.min(hd) / 2;
        let rope_cs = &mut self.s.rope_cs;
        if exact && hp.rope == RopeKind::Neox && !rope_cs.iter().any(|(k, _)| *k == cs_key) {
            let mut t = Vec::with_capacity(n * cs_half);
            for i in 0..n {
                ck::rope_cs_ggml(hp.rope_dim.min(hd), pos0 + i, spec.rope_base, spec.rope_scale, &mut t);
            }
            rope_cs.retain(|(k, _)| k.2 == pos0 && k.3 == n);
            rope_cs.push((cs_key, t));
        }
        let cs_all = take(&mut self.s.rope_cs);
        let table = cs_all.iter().find(|(k, _)| *k == cs_key).map(|(_, t)| t.as_slice());
        let rope: fn(&mut [f32], usize, usize, usize, usize, f32, f32) = match hp.rope {
            RopeKind::Neox if exact => ck::rope_neox_ggml,
            RopeKind::Neox => ck::rope_neox,
            RopeKind::Norm => ck::rope_norm,
        };
        let (rope_dim, neox) = (hp.rope_dim, hp.rope == RopeKind::Neox);
        let rows = &mut self.buf(buf)[..n * width];
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            match table {
                Some(t) if exact && neox => ck::rope_neox_ggml_cs(row, heads, hd, &t[i * cs_half..(i + 1) * cs_half]),
                _ => rope(row, heads, hd, rope_dim, pos0 + i, spec.rope_base, spec.rope_scale),
            }
        }
        self.s.rope_cs = cs_all;
        Ok(())
    }

    fn scale(&mut self, buf: Buf, s: f32) -> Result<(), EngineError> {
        let n = self.n();
        let width = match buf {
            Buf::Q | Buf::Att => self.m.hp.n_head * self.m.hp.head_dim,
            Buf::K | Buf::V => self.m.hp.n_head_kv * self.m.hp.head_dim,
            _ => self.m.hp.n_embd,
        };
        self.buf(buf)[..n * width].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn kv_store(&mut self, layer: usize) -> Result<(), EngineError> {
        let nk = self.m.hp.n_head_kv * self.m.hp.head_dim;
        let LayerCache::Attention(kv) = &mut self.cache.layers[layer];
        for i in 0..self.toks.len() {
            kv.write(self.pos0 + i, &self.s.k[i * nk..(i + 1) * nk], &self.s.v[i * nk..(i + 1) * nk]);
        }
        Ok(())
    }

    fn attend(&mut self, layer: usize, spec: &AttnSpec) -> Result<(), EngineError> {
        let hp = &self.m.hp;
        let nq = hp.n_head * hp.head_dim;
        let shape = super::attention::Shape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            pos0: self.pos0,
            window: spec.window,
            kq_scale: hp.kq_scale,
            ggml_exact: self.exact(),
        };
        let LayerCache::Attention(kv) = &self.cache.layers[layer];
        let n = self.toks.len();
        let (q, att) = (&self.s.q[..n * nq], &mut self.s.att[..n * nq]);
        if self.ordered_attention {
            super::attention::attend_ordered(kv, q, att, shape);
        } else {
            super::attention::attend(kv, q, att, shape);
        }
        Ok(())
    }

    fn glu(&mut self, src: Buf, gate: &Mat, up: &Mat, act: Act) -> Result<(), EngineError> {
        let (mut g, mut u) = (take(&mut self.s.gate), take(&mut self.s.up));
        self.with_src(src, |c, x| c.products(x, &mut [(gate, &mut g), (up, &mut u)]));
        let len = self.n() * gate.rows;
        let (exact, ordered) = (self.exact(), self.ordered);
        grow(&mut self.s.act, len);
        let (gs, us, out) = (&g[..len], &u[..len], &mut self.s.act[..len]);
        match act {
            Act::Silu if ordered => glu_fmath(quant::fmath::silu, gs, us, out),
            Act::Silu => ck::swiglu(gs, us, out),
            // The GPU's ordered mode uploads this f16 table (`geglu_table_f32`).
            Act::GeluTanh if exact => par_elementwise(ck::geglu_ggml, gs, us, out),
            Act::GeluTanh if ordered => glu_fmath(quant::fmath::gelu_tanh, gs, us, out),
            Act::GeluTanh => ck::geglu(gs, us, out),
        }
        (self.s.gate, self.s.up) = (g, u);
        Ok(())
    }

    fn moe(&mut self, layer: usize, src: Buf, w: [&Mat; 4], spec: &MoeSpec) -> Result<(), EngineError> {
        let (d, n, m, p) = (self.m.hp.n_embd, self.n(), self.m, self.kernels());
        let mut moe = take(&mut self.s.moe);
        self.with_src(src, |c, x| {
            super::moe::decoder_moe(layer, m, spec, w, &x[..n * d], n, &mut c.s.o[..n * d], &mut moe, p)
        });
        self.s.moe = moe;
        Ok(())
    }

    fn residual(&mut self, src: Buf, post_norm: Option<&Vec<f32>>) -> Result<(), EngineError> {
        let (d, n, eps, norm) = (self.m.hp.n_embd, self.n(), self.m.hp.rms_eps, self.norm_fn());
        let mut tmp = take(&mut self.s.xn);
        self.with_src(src, |c, o| {
            add_residual(&mut c.s.x[..n * d], &o[..n * d], post_norm.map(|v| &v[..]), eps, &mut tmp, d, norm)
        });
        self.s.xn = tmp;
        Ok(())
    }

    fn end_block(&mut self, _layer: usize, _block: Block) -> Result<(), EngineError> {
        Ok(())
    }

    fn end_layer(&mut self, _layer: usize) -> Result<(), EngineError> {
        let d = self.m.hp.n_embd * self.n();
        if let Some(t) = self.trace.as_mut() {
            t.push(self.s.x[..d].to_vec());
        }
        Ok(())
    }

    fn head(&mut self, first: usize, norm_w: &Vec<f32>, output: &Mat) -> Result<(), EngineError> {
        let (d, n, eps, norm, p) = (self.m.hp.n_embd, self.n(), self.m.hp.rms_eps, self.norm_fn(), self.kernels());
        let Some(logits) = self.logits.take() else { return Ok(()) };
        let s = &mut *self.s;
        for (j, i) in (first..n).enumerate() {
            norm(&s.x[i * d..(i + 1) * d], norm_w, eps, &mut s.xn[j * d..(j + 1) * d]);
        }
        self.m.mm(p, output, 0, &s.xn, n - first, logits);
        Ok(())
    }
}
