//! Matrix products and row-wise helpers of the CPU executor.
//!
//! [`DecoderMatmul::mm`] is the product, with the kernels a session chose ([`Numerics`]: by
//! default ggml-order kernels for the architectures whose numerics copy llama.cpp's,
//! `Arch::ggml_exact`; `--cpu-gemm tiles`; [`matmul_ordered`], the ordered-numerics mode's,
//! the code the GPU's `mmv_ordered` kernel runs per output).

use cpu_kernels as ck;
use cpu_kernels::team;

use crate::MatCpu;
use model::loaded::Numerics;
use model::{Decoder, Mat};

/// The CPU executor's matrix products on [`Model`] (a type of the `model` crate), also used by
/// the GPU host side for the experts it computes on the CPU.
pub trait DecoderMatmul {
    /// `y[n][rows] = x[n][cols] W^T` (expert `e` of a stack) with the kernels `p` names.
    fn mm(&self, p: Numerics, w: &Mat, e: usize, x: &[f32], n: usize, y: &mut [f32]);

    /// Numerics of the same activations with several matrices in one parallel region
    /// (`cpu_kernels::try_matmul_ggml_multi` on the exact path, `try_matmul_multi_gemm`
    /// otherwise; same bits as one [`Self::mm`] per matrix). Not for [`Numerics::Ordered`].
    fn mm_multi<const K: usize>(&self, p: Numerics, x: &[f32], n: usize, jobs: [(&Mat, &mut [f32]); K]);

    /// Which entry point [`Self::mm`] with `p` runs for `n` columns of `w`, when its activations
    /// can be prepared once for several matrices ([`ExpertActs`]); None for the ordered products
    /// and the prompt tiles.
    fn acts_entry(&self, p: Numerics, w: &Mat, n: usize) -> Option<ck::ActsFor>;
}

impl DecoderMatmul for Decoder {
    #[inline]
    fn mm(&self, p: Numerics, w: &Mat, e: usize, x: &[f32], n: usize, y: &mut [f32]) {
        let t = w.matrix(e);
        let (x, y) = (&x[..n * w.cols], &mut y[..n * w.rows]);
        let p = if p == Numerics::Tiles && !ck::Gemm::tiles_apply(t.ty, n) { Numerics::Llama } else { p };
        let r = match p {
            Numerics::Ordered => matmul_ordered(&t, x, n, y).map_err(|e| e.to_string()),
            Numerics::Tiles => {
                ck::try_matmul_gemm(ck::best_path(), ck::Gemm::Tiles, &t, x, n, y).map_err(|e| e.to_string())
            }
            Numerics::Llama if self.hp.arch.ggml_exact() => ck::try_matmul_ggml(&t, x, n, y).map_err(|e| e.to_string()),
            Numerics::Llama => ck::try_matmul(&t, x, n, y).map_err(|e| e.to_string()),
        };
        if let Err(err) = r {
            panic!("matmul ({p:?}) {:?} {}x{} n={n}: {err}", t.ty, t.rows, t.cols);
        }
    }

    fn mm_multi<const K: usize>(&self, p: Numerics, x: &[f32], n: usize, jobs: [(&Mat, &mut [f32]); K]) {
        let ts: Vec<ck::QTensor> = jobs.iter().map(|(w, _)| w.qt()).collect();
        let mut ys: Vec<&mut [f32]> = jobs.into_iter().zip(&ts).map(|((_, y), t)| &mut y[..n * t.rows]).collect();
        let cols = ts[0].cols;
        let x = &x[..n * cols];
        let p = if p == Numerics::Tiles && !ts.iter().any(|t| ck::Gemm::tiles_apply(t.ty, n)) {
            Numerics::Llama
        } else {
            p
        };
        let r = match p {
            Numerics::Llama if self.hp.arch.ggml_exact() => ck::try_matmul_ggml_multi(&ts, x, n, &mut ys),
            Numerics::Tiles => ck::try_matmul_multi_gemm(ck::Gemm::Tiles, &ts, x, n, &mut ys),
            _ => ck::try_matmul_multi(&ts, x, n, &mut ys),
        };
        if let Err(e) = r {
            panic!("matmul multi ({p:?}) n={n}: {e}");
        }
    }

    fn acts_entry(&self, p: Numerics, w: &Mat, n: usize) -> Option<ck::ActsFor> {
        match p {
            Numerics::Ordered => None,
            Numerics::Tiles if ck::Gemm::tiles_apply(w.ty, n) => None,
            _ if self.hp.arch.ggml_exact() => Some(ck::ActsFor::Ggml),
            _ => Some(ck::ActsFor::Fast),
        }
    }
}

/// A MoE layer's input quantized once for the gate and up products of all the experts that
/// the same tokens chose (the GPU's CPU pool: in decode every missed expert reads one token),
/// exactly as `entry`'s products prepare it, so each product keeps its bits.
pub struct ExpertActs {
    gate: ck::PreparedActs,
    /// The up products' own, when their type or width differs from the gate's.
    up: Option<ck::PreparedActs>,
}

impl ExpertActs {
    /// `x` (`n` rows) for the experts of `gate` and `up` (stacks, or one expert's matrices),
    /// or None where the products prepare per matrix (a type without a quantized kernel).
    pub fn new(entry: ck::ActsFor, gate: &Mat, up: &Mat, x: &[f32], n: usize) -> Option<ExpertActs> {
        let prep = |w: &Mat| ck::prepare_acts_as(entry, w.ty, x, n, w.cols).ok();
        let g = prep(gate)?;
        let up = if (up.ty, up.cols) == (gate.ty, gate.cols) { None } else { Some(prep(up)?) };
        Some(ExpertActs { gate: g, up })
    }

    /// The activations of the gate products, and of the up products.
    pub fn gate_up(&self) -> [&ck::PreparedActs; 2] {
        [&self.gate, self.up.as_ref().unwrap_or(&self.gate)]
    }
}

/// `y = t · x` from activations prepared once ([`ExpertActs`]): the same bits as the product
/// the activations were prepared for.
pub fn matmul_prepared(t: &ck::QTensor, acts: &ck::PreparedActs, y: &mut [f32]) {
    if let Err(e) = ck::try_matmul_prepared(t, acts, y) {
        panic!("matmul (prepared) {:?} {}x{} n={}: {e}", t.ty, t.rows, t.cols, acts.n());
    }
}

/// `y[n][rows] = x[n][cols] · Wᵀ` in the ordered-numerics mode: each column of `x` quantized
/// to `w.ty.vec_dot_type()` by `quant::quantize_row` (the reference quantizer), each output
/// `quant::vec_dot` of a weight row with a column (integer sums inside blocks, f32 — F32/F16/
/// BF16: f64 — accumulation across blocks in order). The GPU's `quantize_ref` + `mmv_ordered`
/// kernels run this very code per block / per output, so the two agree bit for bit. Rows are
/// split over the thread team (the order inside a dot is fixed).
pub fn matmul_ordered(w: &ck::QTensor, x: &[f32], n: usize, y: &mut [f32]) -> std::result::Result<(), String> {
    let (k, rows, at) = (w.cols, w.rows, w.ty.vec_dot_type());
    let (Some(rb), Some(ab)) = (w.ty.row_bytes(k), at.row_bytes(k)) else {
        return Err(format!("{} rows of {k} (not a whole number of blocks)", w.ty.name()));
    };
    if !w.ty.has_reference() {
        return Err(format!("{} has no reference dot product", w.ty.name()));
    }
    if x.len() < n * k || y.len() < n * rows || w.data.len() < rows * rb {
        return Err(format!(
            "shapes: x {} (need {}), y {} (need {}), weights {} bytes (need {})",
            x.len(),
            n * k,
            y.len(),
            n * rows,
            w.data.len(),
            rows * rb
        ));
    }
    let mut acts = vec![0u8; n * ab];
    for (c, a) in acts.chunks_exact_mut(ab).enumerate() {
        quant::quantize_row(at, &x[c * k..(c + 1) * k], a).map_err(|e| format!("{e:?}"))?;
    }
    // Row-major results (rows split over the pool), then transposed to [n][rows].
    let mut t = vec![0f32; rows * n];
    const ROWS_PER_TASK: usize = 16;
    team::chunks_mut(&mut t, ROWS_PER_TASK * n, |i, ch| {
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
pub(super) fn glu_fmath(act: fn(f32) -> f32, gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = act(g) * u;
    }
}

/// Rows at which the per-row helpers below go parallel.
const PAR_ROWS: usize = 16;

/// `out[r] = norm(x[r])` for rows of `d` values (rayon over rows for large batches).
pub(super) fn norm_rows(
    norm: fn(&[f32], &[f32], f32, &mut [f32]),
    x: &[f32],
    w: &[f32],
    eps: f32,
    out: &mut [f32],
    d: usize,
) {
    if x.len() / d >= PAR_ROWS {
        team::chunks_mut(&mut out[..x.len()], d, |r, o| norm(&x[r * d..(r + 1) * d], w, eps, o));
    } else {
        out.chunks_mut(d).zip(x.chunks(d)).for_each(|(o, xr)| norm(xr, w, eps, o));
    }
}

/// `x[r] = norm(x[r])` in place for rows of `d` values (one row of scratch per task).
pub(super) fn norm_rows_inplace(
    norm: fn(&[f32], &[f32], f32, &mut [f32]),
    x: &mut [f32],
    w: &[f32],
    eps: f32,
    d: usize,
) {
    let one = |xr: &mut [f32], tmp: &mut Vec<f32>| {
        tmp.clear();
        tmp.extend_from_slice(xr);
        norm(tmp, w, eps, xr);
    };
    if x.len() / d >= PAR_ROWS {
        team::chunks_mut(x, d, |_, xr| one(xr, &mut Vec::with_capacity(d)));
    } else {
        let mut tmp = Vec::with_capacity(d);
        x.chunks_mut(d).for_each(|xr| one(xr, &mut tmp));
    }
}

/// An element-wise `f(a, b, out)` split over rayon for large inputs.
pub(super) fn par_elementwise(f: fn(&[f32], &[f32], &mut [f32]), a: &[f32], b: &[f32], out: &mut [f32]) {
    const CHUNK: usize = 16 << 10;
    if out.len() >= 4 * CHUNK {
        team::chunks_mut(out, CHUNK, |i, o| {
            let r = i * CHUNK..i * CHUNK + o.len();
            f(&a[r.clone()], &b[r], o)
        });
    } else {
        f(a, b, out)
    }
}

/// `x += post_norm(o)` (or `x += o`), row by row; `tmp` holds at least one row.
pub(super) fn add_residual(
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
            let rows = x.len() / d;
            team::chunks_mut(&mut x[..rows * d], d, |r, xr| {
                let mut tmp = vec![0f32; d];
                rms_norm(&o[r * d..(r + 1) * d], w, eps, &mut tmp);
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
