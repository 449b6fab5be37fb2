//! Device matrix products, shared by the executors (the shared decoder's `GpuModel` and
//! Flash-Next's): each [`DevMat`] runs by its [`MatKind`] — MMVQ, MMQ or dequantize + GEMM for
//! quantized types (by `--gpu-prefill` and the token count), GEMM for f32/f16/bf16 (hipBLASLt by
//! the calibration table, else hipBLAS / the software device's host GEMM), `mmv_ordered` in the
//! ordered-numerics mode.

use super::abi::MAX_COLS;
use super::calibrate::LtDispatch;
use super::device::{DType, DevicePtr, Gemm, GpuError, Stream, Transpose};
use super::ops::{GluAct, GpuOps, SlotCols};
use super::upload::{DevMat, MatKind, Tmp, q8_1_bytes};
use crate::options::{GEMM_MIN_TOKENS, GpuOptions, PrefillPath};
use quant::GgmlType;

/// How a quantized matrix's product runs ([`Linear::quantized_path`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum QPath {
    /// `mmq_*` on the Q8_1 activations.
    Mmq,
    /// Dequantized to f16 in `Tmp::wdq`, one f16 GEMM.
    DequantGemm,
    /// `mmvq_*` on the Q8_1 activations, 8 columns a launch.
    Mmvq,
}

/// What a matrix product needs: the launch layer, a stream and the options, borrowed from the
/// executor that owns them.
pub(super) struct Linear<'a> {
    pub ops: &'a GpuOps,
    pub stream: &'a Stream,
    pub opts: &'a GpuOptions,
    /// hipBLASLt calibration (`--calibration`); None: hipBLAS only.
    pub lt: Option<&'a LtDispatch>,
    /// Ordered mode: activations quantized for `mmv_ordered` (room for [`MAX_COLS`] columns of
    /// the widest input); 0 otherwise.
    pub xo: DevicePtr,
    /// f32 bytes of the largest quantized matrix the dequantize + GEMM path may stage in
    /// `Tmp::wdq` (0: never).
    pub dequant_scratch_bytes: usize,
}

impl Linear<'_> {
    /// `y[n][rows] = x[n][cols] · Wᵀ` for expert `e`; `xq` must hold `x`'s Q8_1 quantization
    /// when `w` is quantized (the caller quantizes once per input).
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
        let s = self.stream;
        if self.opts.ordered {
            return self.matmul_ordered(w, e, x, n, y);
        }
        let ty = match w.kind {
            MatKind::Raw => {
                return Err(GpuError::Launch {
                    kernel: "matmul".into(),
                    what: "raw weights outside the ordered mode".into(),
                });
            }
            MatKind::F32 => return self.gemm(w.expert(e), DType::F32, w, x, n, y),
            MatKind::F16 => {
                self.ops.convert_f32_f16(s, x, tmp.xh, (n * w.cols) as u32)?;
                return self.gemm(w.expert(e), DType::F16, w, tmp.xh, n, y);
            }
            MatKind::BF16 => {
                self.ops.convert_f32_bf16(s, x, tmp.xh, (n * w.cols) as u32)?;
                return self.gemm(w.expert(e), DType::BF16, w, tmp.xh, n, y);
            }
            MatKind::Q(ty) => ty,
        };
        match self.quantized_path(ty, w, n, tmp) {
            QPath::Mmq => {
                let (rows, cols) = (w.rows as u32, w.cols as u32);
                return self.ops.mmq(s, ty, self.opts.mmq, w.expert(e), xq, y, rows, n as u32, cols, rows);
            }
            QPath::DequantGemm => {
                // Dequantize to f16, activations to f16, one GEMM with f32 accumulation.
                let nblocks = (w.rows * w.cols / ty.block_k() as usize) as u32;
                self.ops.dequant(s, ty, true, w.expert(e), tmp.wdq, nblocks)?;
                self.ops.convert_f32_f16(s, x, tmp.xh, (n * w.cols) as u32)?;
                return self.gemm(tmp.wdq, DType::F16, w, tmp.xh, n, y);
            }
            QPath::Mmvq => {}
        }
        // MMVQ, 8 columns per launch.
        let xb = q8_1_bytes(w.cols) as u64;
        for c0 in (0..n).step_by(MAX_COLS) {
            let nc = (n - c0).min(MAX_COLS);
            let (xc, yc) = (xq + c0 as u64 * xb, y + (c0 * w.rows * 4) as u64);
            self.ops.mmvq(s, ty, nc as u32, w.expert(e), xc, yc, None, w.rows as u32, w.cols as u32, w.rows as u32)?;
        }
        Ok(())
    }

    /// How [`Linear::matmul`] runs a matrix of the quantized type `ty` over `n` rows (fast
    /// mode): the `--gpu-prefill` rule, the one place it is written.
    fn quantized_path(&self, ty: super::abi::WType, w: &DevMat, n: usize, tmp: Tmp) -> QPath {
        let gemm = match self.opts.prefill {
            PrefillPath::Mmvq => false,
            PrefillPath::Auto => n >= GEMM_MIN_TOKENS,
            PrefillPath::DequantGemm => n > 1,
            PrefillPath::Mmq if n >= GEMM_MIN_TOKENS && super::abi::mmq_kernel(ty, false).is_some() => {
                return QPath::Mmq;
            }
            PrefillPath::Mmq => n >= GEMM_MIN_TOKENS,
        };
        if gemm && tmp.wdq != 0 && w.rows * w.cols * 4 <= self.dequant_scratch_bytes {
            QPath::DequantGemm
        } else {
            QPath::Mmvq
        }
    }

    /// Whether [`Linear::matmul`] of `w` over `n` rows with `tmp` runs MMVQ (a quantized matrix,
    /// fast mode, below the prompt rule's threshold): what expert dispatch computes too.
    pub(super) fn is_mmvq(&self, w: &DevMat, n: usize, tmp: Tmp) -> bool {
        match w.kind {
            MatKind::Q(ty) if !self.opts.ordered => self.quantized_path(ty, w, n, tmp) == QPath::Mmvq,
            _ => false,
        }
    }

    /// Whether [`Linear::matmul`] of `w` over `n` rows with `tmp` reads the Q8_1 activations
    /// `xq` (MMVQ, MMQ), so the caller must quantize its input first; the GEMM paths and the
    /// ordered products read the f32 rows.
    pub(super) fn reads_q8_1(&self, w: &DevMat, n: usize, tmp: Tmp) -> bool {
        match w.kind {
            MatKind::Q(ty) if !self.opts.ordered => self.quantized_path(ty, w, n, tmp) != QPath::DequantGemm,
            _ => false,
        }
    }

    /// Ordered mode: `x` (f32, `n <= MAX_COLS` columns) quantized to the weight type's
    /// `vec_dot_type` by `quantize_ref`, then `mmv_ordered`: the CPU's ordered matmul bit for bit.
    fn matmul_ordered(
        &self,
        w: &DevMat,
        e: usize,
        x: DevicePtr,
        n: usize,
        y: DevicePtr,
    ) -> std::result::Result<(), GpuError> {
        let s = self.stream;
        if n > MAX_COLS || self.xo == 0 {
            return Err(GpuError::Launch {
                kernel: "mmv_ordered".into(),
                what: format!("{n} columns (at most {MAX_COLS} in ordered mode)"),
            });
        }
        let at = w.ty.vec_dot_type();
        let a = if at == GgmlType::F32 {
            x
        } else {
            self.ops.quantize_ref(s, at, x, self.xo, (n * w.cols) as u32)?;
            self.xo
        };
        self.ops.mmv_ordered(s, w.ty, w.expert(e), a, y, w.rows as u32, n as u32, w.cols as u32)
    }

    /// `y[n][rows] = x[n][cols] · Aᵀ` with `a` and `x` of type `t` shaped like `w`, f32 output
    /// and accumulation (hipBLASLt by the calibration table, else hipBLAS / the host GEMM).
    fn gemm(
        &self,
        a: DevicePtr,
        t: DType,
        w: &DevMat,
        x: DevicePtr,
        n: usize,
        y: DevicePtr,
    ) -> std::result::Result<(), GpuError> {
        self.gemm_dispatch(
            self.stream,
            &Gemm {
                trans_a: Transpose::T,
                trans_b: Transpose::N,
                m: w.rows,
                n,
                k: w.cols,
                alpha: 1.0,
                a,
                a_type: t,
                lda: w.cols,
                stride_a: 0,
                b: x,
                b_type: t,
                ldb: w.cols,
                stride_b: 0,
                beta: 0.0,
                c: y,
                c_type: DType::F32,
                ldc: w.rows,
                stride_c: 0,
                batch: 1,
                compute: super::device::ComputeType::F32,
            },
        )
    }

    /// hipBLASLt when the calibration table has a row for this shape (calibrate.rs), else
    /// hipBLAS (`GpuApi::gemm`).
    fn gemm_dispatch(&self, stream: &Stream, g: &Gemm) -> std::result::Result<(), GpuError> {
        if let Some(lt) = self.lt
            && lt.try_gemm(&**self.ops.api(), stream, g)
        {
            return Ok(());
        }
        self.ops.api().gemm(stream, g)
    }

    /// Quantizes `n` rows of `k` f32 values at `x` to Q8_1 at `xq` when `k` allows it.
    /// Nothing in ordered mode (each matmul quantizes for its weight type).
    pub(super) fn quantize(
        &self,
        x: DevicePtr,
        xq: DevicePtr,
        n: usize,
        k: usize,
    ) -> std::result::Result<(), GpuError> {
        if self.opts.ordered {
            return Ok(());
        }
        if k.is_multiple_of(32) { self.ops.quantize_q8_1(self.stream, x, xq, (n * k) as u32) } else { Ok(()) }
    }
}

/// The buffers of a routed-expert run by device dispatch ([`Linear::experts_by_dispatch`]), each
/// indexed by slot (`token·k + rank`) from the window's first token.
#[derive(Clone, Copy)]
pub(super) struct DispatchBuffers {
    /// The chosen expert of each slot (its index in the stacks; `abi::MOE_SLOT_MISS` skips the
    /// slot: its output row is left as it is).
    pub ids: DevicePtr,
    /// The tokens' inputs as Q8_1 rows.
    pub xq: DevicePtr,
    /// SwiGLU output rows `[slot][ff]`, and their Q8_1 quantization.
    pub act: DevicePtr,
    pub act_q: DevicePtr,
    /// Gate and up outputs `[slot][ff]` when they do not fuse (types differ or
    /// `--no-fused-glu`).
    pub gate: DevicePtr,
    pub up: DevicePtr,
    /// Output rows `[slot][cols of the input]`.
    pub y: DevicePtr,
}

/// A chunk's slots ordered by expert ([`GpuOps::moe_sort_slots`]), each buffer `[n·k]` u32: the
/// sorted ids, each sorted slot's token, each slot's sorted row (the combine's map).
#[derive(Clone, Copy, Debug)]
pub struct SlotOrder {
    pub ids: DevicePtr,
    pub cols: DevicePtr,
    pub map: DevicePtr,
}

impl SlotOrder {
    /// Room for `n_slots` slots.
    pub(super) fn alloc(up: &mut super::upload::Uploader, n_slots: usize) -> model::error::Result<SlotOrder> {
        Ok(SlotOrder { ids: up.zeroed(n_slots * 4)?, cols: up.zeroed(n_slots * 4)?, map: up.zeroed(n_slots * 4)? })
    }
}

impl Linear<'_> {
    /// The routed experts of `n` tokens (`k` each) by device dispatch: `mmvq_moe_*` read the
    /// choice in `b.ids` on the device (fused gate/up + SiLU when both have one type), so nothing
    /// is read back (what a graph needs). Tokens go in groups whose slots fit one launch
    /// (`MOE_MAX_SLOTS`); a launch stages at most one column per token of an expert.
    pub(super) fn experts_by_dispatch(
        &self,
        mats: [&DevMat; 3],
        n_expert: usize,
        k: usize,
        n: usize,
        b: &DispatchBuffers,
    ) -> std::result::Result<(), GpuError> {
        let group = (super::abi::MOE_MAX_SLOTS as usize / k).clamp(1, MAX_COLS);
        let xb = q8_1_bytes(mats[0].cols) as u64;
        for t0 in (0..n).step_by(group) {
            let nt = (n - t0).min(group);
            let ids = b.ids + (t0 * k * 4) as u64;
            self.dispatch_slots(
                mats,
                n_expert,
                t0 * k,
                nt * k,
                ids,
                (b.xq + t0 as u64 * xb, (k as u32).into()),
                nt as u32,
                b,
            )?;
        }
        Ok(())
    }

    /// [`Linear::experts_by_dispatch`] of a prompt chunk with its slots ordered by expert first
    /// (`order`): the launches then run over consecutive sorted slots, so an expert's tokens
    /// meet in one launch (up to [`MAX_COLS`] columns a pass) and its weights are read about
    /// once a chunk instead of once per launch of `MOE_MAX_SLOTS / k` tokens. Each slot's
    /// product is the same (its bits do not depend on the slots computed beside it); its
    /// output row is `order.map[slot]`, which the combine must read through.
    pub(super) fn experts_sorted(
        &self,
        mats: [&DevMat; 3],
        n_expert: usize,
        k: usize,
        n: usize,
        b: &DispatchBuffers,
        order: &SlotOrder,
    ) -> std::result::Result<(), GpuError> {
        let ns = n * k;
        self.ops.moe_sort_slots(self.stream, b.ids, order.ids, order.cols, order.map, ns as u32, k as u32)?;
        self.experts_listed(mats, n_expert, ns, order.ids, order.cols, b)
    }

    /// Routed experts by device dispatch over a list of `ns` rows: row `r` runs expert
    /// `ids[r]` (its index in the stacks) on token `cols[r]` of `b.xq`, into rows `r` of
    /// `b.act` / `b.y` (`b.ids` unused). Rows of one expert should be adjacent: they then share
    /// one read of its weights ([`Linear::experts_sorted`], and a prompt chunk's experts read
    /// back, `qwen4exp`'s `experts_grouped`).
    pub(super) fn experts_listed(
        &self,
        mats: [&DevMat; 3],
        n_expert: usize,
        ns: usize,
        ids: DevicePtr,
        cols: DevicePtr,
        b: &DispatchBuffers,
    ) -> std::result::Result<(), GpuError> {
        let step = super::abi::MOE_MAX_SLOTS as usize;
        for s0 in (0..ns).step_by(step) {
            let (ids, cols) = (ids + (s0 * 4) as u64, cols + (s0 * 4) as u64);
            self.dispatch_slots(
                mats,
                n_expert,
                s0,
                (ns - s0).min(step),
                ids,
                (b.xq, SlotCols::List(cols)),
                MAX_COLS as u32,
                b,
            )?;
        }
        Ok(())
    }

    /// One launch group of routed experts: slots `s0..s0 + ns` (their rows of `b.act`,
    /// `b.gate`, `b.up`, `b.y`) with expert ids at `ids` and the gate/up input `x` (Q8_1 rows,
    /// and which one each slot reads); `max_group` slots at most share an expert.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_slots(
        &self,
        [gate, up, down]: [&DevMat; 3],
        n_expert: usize,
        s0: usize,
        ns: usize,
        ids: DevicePtr,
        (xq, x_cols): (DevicePtr, SlotCols),
        max_group: u32,
        b: &DispatchBuffers,
    ) -> std::result::Result<(), GpuError> {
        let (ops, st) = (self.ops, self.stream);
        let (MatKind::Q(tg), MatKind::Q(tu), MatKind::Q(td)) = (gate.kind, up.kind, down.kind) else {
            return Err(GpuError::Launch {
                kernel: "mmvq_moe".into(),
                what: "device dispatch needs quantized experts".into(),
            });
        };
        let (d, ff, ne) = (gate.cols, gate.rows, n_expert as u32);
        let ab = q8_1_bytes(ff) as u64;
        let act = b.act + (s0 * ff * 4) as u64;
        let n32 = ns as u32;
        if tg == tu && self.opts.fused_glu {
            ops.mmvq_moe(
                st,
                tg,
                Some((up.ptr, GluAct::Silu)),
                gate.ptr,
                gate.mat_bytes as u64,
                ne,
                xq,
                x_cols,
                ids,
                n32,
                act,
                ff as u32,
                d as u32,
                max_group,
            )?;
        } else {
            let (yg, yu) = (b.gate + (s0 * ff * 4) as u64, b.up + (s0 * ff * 4) as u64);
            ops.mmvq_moe(
                st,
                tg,
                None,
                gate.ptr,
                gate.mat_bytes as u64,
                ne,
                xq,
                x_cols,
                ids,
                n32,
                yg,
                ff as u32,
                d as u32,
                max_group,
            )?;
            ops.mmvq_moe(
                st,
                tu,
                None,
                up.ptr,
                up.mat_bytes as u64,
                ne,
                xq,
                x_cols,
                ids,
                n32,
                yu,
                ff as u32,
                d as u32,
                max_group,
            )?;
            ops.glu(st, yg, yu, act, n32 * ff as u32, GluAct::Silu)?;
        }
        let aq = b.act_q + s0 as u64 * ab;
        self.quantize(act, aq, ns, ff)?;
        let y = b.y + (s0 * d * 4) as u64;
        ops.mmvq_moe(
            st,
            td,
            None,
            down.ptr,
            down.mat_bytes as u64,
            ne,
            aq,
            1u32,
            ids,
            n32,
            y,
            d as u32,
            ff as u32,
            max_group,
        )
    }
}
