//! The decoder's operations ([`DecoderOps`]) as gfx11 launches, for one window of tokens
//! (or one prompt chunk on the GEMM path), through [`GpuOps`](super::ops::GpuOps) on one
//! stream: the same launches on a real card and on the software device, and what a decode
//! graph captures.
//!
//! Every projection's input is quantized to Q8_1 once ([`GpuModel::quantize`]) and each
//! matrix runs by its [`MatKind`] (`super::linear`): MMVQ, MMQ or dequantize + GEMM for quantized types (by
//! `--gpu-prefill` and the token count), GEMM for f32/f16/bf16, `mmv_ordered` in the
//! ordered-numerics mode.

use super::abi::MAX_COLS;
use super::device::{DevicePtr, GpuError};
use super::linear::Linear;
use super::model::{GpuModel, GpuSession};
use super::ops::{GluAct, KvFormat, RowType};
use super::upload::{DevMat, MatKind, Tmp};
use model::decoder::{Block, Buf, DecoderOps};
use model::{Act, AttnSpec, Ffn, MoeSpec};

/// One window of a device session.
pub(super) struct GpuChunk<'a> {
    pub g: &'a GpuModel,
    pub sess: &'a mut GpuSession,
    /// Tokens in the window.
    pub n: usize,
    /// The residual after every layer, when tracing.
    pub trace: Option<Vec<Vec<f32>>>,
    /// Distinct experts the last MoE block ran (profiling).
    pub moe_experts: usize,
}

impl GpuChunk<'_> {
    fn ptr(&self, b: Buf) -> DevicePtr {
        let sc = &self.sess.sc;
        match b {
            Buf::X => sc.x,
            Buf::Xn => sc.xn,
            Buf::Q => sc.q,
            Buf::K => sc.k,
            Buf::V => sc.v,
            Buf::Att => sc.att,
            Buf::O => sc.o,
            Buf::Act => sc.act,
        }
    }
    /// Row width of a buffer.
    fn width(&self, b: Buf) -> usize {
        let hp = &self.g.model.hp;
        match b {
            Buf::Q | Buf::Att => hp.n_head * hp.head_dim,
            Buf::K | Buf::V => hp.n_head_kv * hp.head_dim,
            Buf::Act => hp.moe.as_ref().map_or(hp.n_ff, |m| m.n_ff_exp),
            Buf::X | Buf::Xn | Buf::O => hp.n_embd,
        }
    }
    fn tmp(&self) -> Tmp {
        Tmp { wdq: self.sess.sc.wdq, xh: self.sess.sc.xh }
    }
    /// The norm kernel whose float order matches the CPU backend's for this architecture.
    fn rms_norm(&self, x: DevicePtr, w: DevicePtr, y: DevicePtr, n: usize, rows: usize) -> Result<(), GpuError> {
        let (ops, st, eps) = (&self.g.res.ops, &self.g.res.stream, self.g.model.hp.rms_eps);
        if self.g.model.hp.arch.ggml_exact() {
            ops.rms_norm_ggml(st, x, w, y, n as u32, rows as u32, eps)
        } else {
            ops.rms_norm(st, x, w, y, n as u32, rows as u32, eps)
        }
    }
    /// Adds the device counters since the last call to `part` (profiling only).
    fn count(&mut self, part: &'static str, ideal: u64) {
        if let Some(p) = self.sess.profile.as_mut() {
            let s = self.g.res.ops.api().take_stats().unwrap_or_default();
            let e = p.parts.entry(part).or_default();
            e.launches += s.launches;
            e.instructions += s.instructions;
            e.global_bytes += s.global_bytes_read + s.global_bytes_written;
            e.ideal_bytes += ideal;
        }
    }
    fn act_bytes(&self) -> u64 {
        (self.n * self.g.model.hp.n_embd * 4) as u64
    }
}

impl DecoderOps for GpuChunk<'_> {
    type Mat = DevMat;
    type Vector = DevicePtr;
    type Error = GpuError;

    fn embed(&mut self, emb: &DevMat, scale: Option<f32>) -> Result<(), GpuError> {
        let (n, d) = (self.n, self.g.model.hp.n_embd);
        let (ety, row_bytes) = match emb.kind {
            MatKind::Q(t) => (RowType::W(t), d / t.block_k() as usize * t.block_bytes() as usize),
            MatKind::F16 => (RowType::F16, d * 2),
            _ => (RowType::F32, d * 4),
        };
        let sc = &self.sess.sc;
        self.g.res.ops.get_rows(
            &self.g.res.stream,
            ety,
            emb.ptr,
            sc.ids,
            n as u32,
            d as u32,
            sc.x,
            scale.unwrap_or(1.0),
        )?;
        let ab = self.act_bytes();
        self.count("embed", (n * row_bytes) as u64 + ab);
        Ok(())
    }

    fn norm(&mut self, src: Buf, w: &DevicePtr, dst: Buf) -> Result<(), GpuError> {
        self.rms_norm(self.ptr(src), *w, self.ptr(dst), self.width(src), self.n)
    }

    fn head_norm(&mut self, buf: Buf, w: &DevicePtr, heads: usize) -> Result<(), GpuError> {
        let p = self.ptr(buf);
        self.rms_norm(p, *w, p, self.g.model.hp.head_dim, self.n * heads)
    }

    fn project(&mut self, src: Buf, outs: &[(&DevMat, Buf)]) -> Result<(), GpuError> {
        let (x, xq, n, tmp) = (self.ptr(src), self.sess.sc.xq, self.n, self.tmp());
        let Some((first, _)) = outs.first() else { return Ok(()) };
        self.g.quantize(x, xq, n, first.cols)?;
        for (w, dst) in outs {
            self.g.matmul(w, 0, x, xq, n, self.ptr(*dst), tmp)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, buf: Buf, b: &DevicePtr) -> Result<(), GpuError> {
        self.g.res.ops.add_rows(&self.g.res.stream, self.ptr(buf), *b, self.width(buf) as u32, self.n as u32, 0)
    }

    fn rope(&mut self, buf: Buf, heads: usize, spec: &AttnSpec) -> Result<(), GpuError> {
        let hp = &self.g.model.hp;
        let key = (spec.rope_base, spec.rope_scale);
        let Some(i) = self.g.rope_params.iter().position(|&p| p == key) else {
            return Err(GpuError::Launch {
                kernel: "rope".into(),
                what: format!("no table for rope base {} scale {}", key.0, key.1),
            });
        };
        let (neox, exact) = (hp.rope == model::RopeKind::Neox, hp.arch.ggml_exact());
        let (hd, rd) = (hp.head_dim as u32, hp.rope_dim.min(hp.head_dim) as u32);
        let (table, posb) = (self.sess.rope_tables[i], self.sess.sc.pos);
        self.g.res.ops.rope(
            &self.g.res.stream,
            self.ptr(buf),
            posb,
            table,
            self.n as u32,
            heads as u32,
            hd,
            rd,
            neox,
            exact && neox,
        )
    }

    fn scale(&mut self, buf: Buf, s: f32) -> Result<(), GpuError> {
        self.g.res.ops.scale(&self.g.res.stream, self.ptr(buf), (self.n * self.width(buf)) as u32, s)
    }

    fn kv_store(&mut self, layer: usize) -> Result<(), GpuError> {
        let hp = &self.g.model.hp;
        let (n, nkv, hd) = (self.n as u32, hp.n_head_kv as u32, hp.head_dim as u32);
        let [kc, ks, vc, vs] = self.sess.kv[layer];
        let (ops, st, fmt, posb) = (&self.g.res.ops, &self.g.res.stream, self.sess.fmt, self.sess.sc.pos);
        ops.kv_store(st, fmt, self.ptr(Buf::K), kc, ks, posb, n, nkv, hd)?;
        ops.kv_store(st, fmt, self.ptr(Buf::V), vc, vs, posb, n, nkv, hd)
    }

    fn attend(&mut self, layer: usize, spec: &AttnSpec) -> Result<(), GpuError> {
        let hp = &self.g.model.hp;
        let [kc, ks, vc, vs] = self.sess.kv[layer];
        let (nh, nkv, hd) = (hp.n_head as u32, hp.n_head_kv as u32, hp.head_dim as u32);
        let window = spec.window.map_or(0, |w| w as u32);
        let (q, att, posb) = (self.ptr(Buf::Q), self.ptr(Buf::Att), self.sess.sc.pos);
        let g = self.g;
        g.res.ops.attention(
            &g.res.stream,
            g.res.opts.attn,
            self.sess.fmt,
            q,
            kc,
            ks,
            vc,
            vs,
            att,
            posb,
            self.n as u32,
            nh,
            nkv,
            hd,
            window,
            hp.kq_scale,
        )
    }

    fn glu(&mut self, src: Buf, wg: &DevMat, wu: &DevMat, act: Act) -> Result<(), GpuError> {
        let g = self.g;
        let (ops, st, sc, n) = (&g.res.ops, &g.res.stream, &self.sess.sc, self.n);
        let (xn, xq, out, tmp) = (self.ptr(src), sc.xq, sc.act, self.tmp());
        let (d, ff) = (wg.cols, wg.rows);
        g.quantize(xn, xq, n, d)?;
        let ga = match act {
            Act::Silu => GluAct::Silu,
            Act::GeluTanh => GluAct::GeluTanh,
        };
        match (wg.kind, wu.kind) {
            // Decode / verify windows: gate, up and the activation in one launch.
            (MatKind::Q(tg), MatKind::Q(tu)) if tg == tu && g.res.opts.fused_glu && n <= MAX_COLS => {
                ops.mmvq_glu(st, tg, n as u32, wg.ptr, wu.ptr, xq, out, None, ff as u32, d as u32, ff as u32, ga)
            }
            // Ordered mode, Gemma: the CPU's f16 GELU table.
            _ if g.gelu_table != 0 && ga == GluAct::GeluTanh => {
                g.matmul(wg, 0, xn, xq, n, sc.gate, tmp)?;
                g.matmul(wu, 0, xn, xq, n, sc.up, tmp)?;
                ops.geglu_table(st, sc.gate, sc.up, out, g.gelu_table, (n * ff) as u32)
            }
            _ => {
                g.matmul(wg, 0, xn, xq, n, sc.gate, tmp)?;
                g.matmul(wu, 0, xn, xq, n, sc.up, tmp)?;
                ops.glu(st, sc.gate, sc.up, out, (n * ff) as u32, ga)
            }
        }
    }

    fn moe(&mut self, layer: usize, src: Buf, w: [&DevMat; 4], _spec: &MoeSpec) -> Result<(), GpuError> {
        if src != Buf::Xn {
            return Err(GpuError::Launch {
                kernel: "moe".into(),
                what: format!("routed experts read Xn, not {src:?}"),
            });
        }
        let (g, n, d) = (self.g, self.n, self.g.model.hp.n_embd);
        g.quantize(self.sess.sc.xn, self.sess.sc.xq, n, d)?;
        let profiling = self.sess.profile.is_some();
        self.moe_experts = if g.moe_by_handoff(n, profiling) {
            g.moe_handoff(&self.sess.sc, layer, n, w)?;
            0
        } else if g.moe_on_device(n) {
            g.moe_device(&self.sess.sc, n, w, profiling)?
        } else {
            g.moe(&self.sess.sc, layer, n, w)?
        };
        Ok(())
    }

    fn residual(&mut self, src: Buf, post_norm: Option<&DevicePtr>) -> Result<(), GpuError> {
        let (o, x, d, n) = (self.ptr(src), self.sess.sc.x, self.g.model.hp.n_embd, self.n);
        if let Some(p) = post_norm {
            self.rms_norm(o, *p, o, d, n)?;
        }
        self.g.res.ops.add_rows(&self.g.res.stream, x, o, d as u32, n as u32, d as u32)
    }

    fn end_block(&mut self, layer: usize, block: Block) -> Result<(), GpuError> {
        if self.sess.profile.is_none() {
            return Ok(());
        }
        let (g, n, ab) = (self.g, self.n, self.act_bytes());
        let l = &g.w.layers[layer];
        match block {
            Block::Attention => {
                let hp = &g.model.hp;
                let nk = hp.n_head_kv * hp.head_dim;
                let kv_elem = match self.sess.fmt {
                    KvFormat::F16 => 2.0,
                    KvFormat::Int8 => 1.0 + 4.0 / hp.head_dim as f64,
                };
                let model::LayerKind::Attention(spec) = &hp.layers[layer];
                // Cells read: each token attends to its window (the cache holds n_past + n).
                let cells: usize = (0..n)
                    .map(|i| {
                        let p = self.sess.n_past + i + 1;
                        spec.window.map_or(p, |w| p.min(w))
                    })
                    .sum();
                let kv =
                    (cells as f64 * 2.0 * nk as f64 * kv_elem) as u64 + (n as f64 * 2.0 * nk as f64 * kv_elem) as u64;
                let a = &l.attn;
                let w = [&a.wq, &a.wk, &a.wv, &a.wo].iter().map(|m| m.mat_bytes as u64).sum::<u64>();
                self.count("attention", w + kv + 2 * ab);
            }
            Block::Ffn => {
                let (part, w) = match &l.ffn.ffn {
                    Ffn::Dense { gate, up, down } => ("ffn", gate.mat_bytes + up.mat_bytes + down.mat_bytes),
                    Ffn::Moe { router, gate, up, down } => {
                        ("moe", router.mat_bytes + self.moe_experts * (gate.mat_bytes + up.mat_bytes + down.mat_bytes))
                    }
                };
                self.count(part, w as u64 + 2 * ab);
            }
        }
        Ok(())
    }

    fn end_layer(&mut self, _layer: usize) -> Result<(), GpuError> {
        let Some(t) = self.trace.as_mut() else { return Ok(()) };
        let (api, d) = (self.g.res.ops.api(), self.n * self.g.model.hp.n_embd);
        api.stream_synchronize(&self.g.res.stream)?;
        let mut b = vec![0u8; d * 4];
        api.memcpy_dtoh(&mut b, self.sess.sc.x)?;
        t.push(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect());
        Ok(())
    }

    fn head(&mut self, first: usize, norm: &DevicePtr, output: &DevMat) -> Result<(), GpuError> {
        let (g, n, d) = (self.g, self.n, self.g.model.hp.n_embd);
        let sc = &self.sess.sc;
        let m = n - first;
        let xf = sc.x + (first * d * 4) as u64;
        self.rms_norm(xf, *norm, sc.xn, d, m)?;
        g.quantize(sc.xn, sc.xq, m, d)?;
        g.matmul(output, 0, sc.xn, sc.xq, m, sc.logits, Tmp { wdq: 0, ..self.tmp() })?;
        let bytes = output.mat_bytes + m * d * 4 + m * g.model.n_vocab * 4;
        self.count("head", bytes as u64);
        Ok(())
    }
}

impl GpuModel {
    /// The device linear algebra with this model's options (`super::linear`).
    pub(super) fn lin(&self) -> Linear<'_> {
        Linear {
            ops: &self.res.ops,
            stream: &self.res.stream,
            opts: &self.res.opts,
            lt: self.lt.as_ref(),
            xo: self.xo,
            dequant_scratch_bytes: self.dequant_scratch_bytes,
        }
    }

    /// [`Linear::matmul`] with this model's options.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &self,
        w: &DevMat,
        e: usize,
        x: DevicePtr,
        xq: DevicePtr,
        n: usize,
        y: DevicePtr,
        tmp: Tmp,
    ) -> std::result::Result<(), GpuError> {
        self.lin().matmul(w, e, x, xq, n, y, tmp)
    }

    /// [`Linear::quantize`] with this model's options.
    pub(super) fn quantize(
        &self,
        x: DevicePtr,
        xq: DevicePtr,
        n: usize,
        k: usize,
    ) -> std::result::Result<(), GpuError> {
        self.lin().quantize(x, xq, n, k)
    }
}

// The window loop of `GpuModel` (model.rs) runs the program here, beside its operations.
impl GpuModel {
    /// Every launch of one window (inputs already in `ids`/`pos`): the decoder's program
    /// (`model::decoder::forward`) over this device's operations ([`super::exec::GpuChunk`]).
    pub(super) fn launches(
        &self,
        sess: &mut GpuSession,
        n: usize,
        first_row: Option<usize>,
    ) -> std::result::Result<(), GpuError> {
        if let Some(p) = sess.profile.as_mut() {
            let _ = self.res.ops.api().take_stats();
            p.tokens += n as u64;
        }
        let trace = sess.trace.take().map(|mut t| {
            t.clear();
            t
        });
        let mut chunk = super::exec::GpuChunk { g: self, sess, n, trace, moe_experts: 0 };
        let r = model::decoder::forward(&mut chunk, &self.model.hp, &self.w, first_row);
        let trace = chunk.trace.take();
        sess.trace = trace;
        r
    }
}
