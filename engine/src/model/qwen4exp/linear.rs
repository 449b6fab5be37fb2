//! Weight matrices as the qwen4exp layers see them, and the small f32 helpers (RMSNorm, NEOX
//! rope, activations, f16 rounding) shared by the layer modules.
//!
//! A [`Mat`] is a row-major matrix in any ggml block type, either owned (tests, synthetic
//! layers) or a window into a memory-mapped [`gguf::GgufFile`] (so a multi-gigabyte model is
//! never copied). Products follow ggml's CPU backend: the activation row is first converted to
//! the weight type's `vec_dot_type` (Q8_0 for Q8_0/Q5_0/IQ4_NL, f16 for F16 weights, unchanged
//! for F32) and every output element is one `vec_dot` of a weight row with that activation.
//! Because every output element of [`Mat::matmul`] is computed by the very same function as in
//! [`Mat::matvec`], a batched pass is bit-identical to token-by-token passes. F32, F16 and the
//! Q8_0-paired types (Q8_0, Q5_0, Q4_0, IQ4_NL) run here, with llama.cpp's x86 activation
//! rounding; K-quant/IQ weights go to `cpu_kernels`' SIMD kernels one token at a time.
//!
//! The f32 helpers copy the ggml formulas where rounding matters: RMSNorm sums squares in f64
//! (`ggml_float`), rope angles are built iteratively in f32 (`θ_i = t·s^i`).

use std::sync::Arc;

use gguf::GgufFile;
use quant::GgmlType;
use rayon::prelude::*;

/// Where the bytes of a [`Mat`] live.
enum Bytes {
    /// Owned, stored in u64 words so that F32 data is always 4-byte aligned.
    Owned { words: Vec<u64>, len: usize },
    /// `len` bytes at `start` inside tensor number `tensor` of a mapped file.
    Mapped {
        file: Arc<GgufFile>,
        tensor: usize,
        start: usize,
        len: usize,
    },
}

/// A row-major weight matrix `[rows][cols]` (ggml ne = `[cols, rows]`).
pub struct Mat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    bytes: Bytes,
}

impl std::fmt::Debug for Mat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mat({} {}x{})", self.ty.name(), self.rows, self.cols)
    }
}

/// Why a matrix cannot be built from the given bytes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MatError {
    #[error("type {0:?} has no reference implementation")]
    Unsupported(GgmlType),
    #[error("row length {cols} is not a whole number of {ty:?} blocks")]
    Ragged { ty: GgmlType, cols: usize },
    #[error("{ty:?} {rows}x{cols} needs {expected} bytes, got {got}")]
    Size {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
}

fn geometry(ty: GgmlType, rows: usize, cols: usize, got: usize) -> Result<usize, MatError> {
    if !ty.has_reference() {
        return Err(MatError::Unsupported(ty));
    }
    let rb = ty.row_bytes(cols).ok_or(MatError::Ragged { ty, cols })?;
    let expected = rb.checked_mul(rows).ok_or(MatError::Size {
        ty,
        rows,
        cols,
        expected: usize::MAX,
        got,
    })?;
    if expected != got {
        return Err(MatError::Size {
            ty,
            rows,
            cols,
            expected,
            got,
        });
    }
    Ok(rb)
}

impl Mat {
    /// An owned F32 matrix from row-major values.
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Mat, MatError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Mat::from_raw(GgmlType::F32, rows, cols, &bytes)
    }

    /// An owned matrix from raw ggml bytes (`rows` rows of `ty.row_bytes(cols)` bytes).
    pub fn from_raw(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Mat, MatError> {
        let row_bytes = geometry(ty, rows, cols, bytes.len())?;
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_le_bytes(b);
        }
        Ok(Mat {
            ty,
            rows,
            cols,
            row_bytes,
            bytes: Bytes::Owned {
                words,
                len: bytes.len(),
            },
        })
    }

    /// A window of `rows` rows starting at byte `start` of tensor `tensor` of `file`.
    pub(crate) fn mapped(
        file: &Arc<GgufFile>,
        tensor: usize,
        start: usize,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Mat, MatError> {
        let row_bytes = ty.row_bytes(cols).ok_or(MatError::Ragged { ty, cols })?;
        let len = row_bytes * rows;
        let avail = file
            .tensors()
            .get(tensor)
            .map_or(0, |t| file.tensor_data(t).len().saturating_sub(start));
        if avail < len {
            return Err(MatError::Size {
                ty,
                rows,
                cols,
                expected: len,
                got: avail,
            });
        }
        geometry(ty, rows, cols, len)?;
        Ok(Mat {
            ty,
            rows,
            cols,
            row_bytes,
            bytes: Bytes::Mapped {
                file: file.clone(),
                tensor,
                start,
                len,
            },
        })
    }

    /// All bytes of the matrix.
    pub fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Owned { words, len } => {
                // SAFETY: u64 -> u8 reinterpretation of an initialised Vec; u8 has no alignment
                // requirement and `len <= 8 * words.len()` by construction.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
            Bytes::Mapped {
                file,
                tensor,
                start,
                len,
            } => &file.tensor_data(&file.tensors()[*tensor])[*start..*start + *len],
        }
    }

    /// Bytes of row `r`.
    pub fn row_data(&self, r: usize) -> &[u8] {
        &self.data()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Dequantizes row `r` into `out[..cols]` (exact, like ggml's get_rows).
    pub fn get_row(&self, r: usize, out: &mut [f32]) {
        if quant::dequantize_row(self.ty, self.row_data(r), &mut out[..self.cols]).is_err() {
            out[..self.cols].fill(f32::NAN); // unreachable: geometry validated at construction
        }
    }

    /// The activation row converted to `vec_dot_type`, as ggml does before a mat-mul.
    fn prepare(&self, x: &[f32]) -> Act {
        match self.ty {
            GgmlType::F32 => Act::F32,
            GgmlType::F16 => Act::Bytes(
                x.iter()
                    .flat_map(|&v| quant::f32_to_f16(v).to_le_bytes())
                    .collect(),
            ),
            ty if ty.vec_dot_type() == GgmlType::Q8_0 => Act::Bytes(quantize_q8_0_x86(x)),
            ty => {
                let vt = ty.vec_dot_type();
                let mut buf = vec![0u8; vt.row_bytes(x.len()).unwrap_or(0)];
                if quant::quantize_row(vt, x, &mut buf).is_err() {
                    return Act::Bad;
                }
                Act::Bytes(buf)
            }
        }
    }

    fn dot(&self, r: usize, x: &[f32], act: &Act) -> f32 {
        let w = self.row_data(r);
        match act {
            Act::F32 => dot_f32_bytes(w, x),
            Act::Bytes(a) => quant::vec_dot(self.ty, self.cols, w, a).unwrap_or(f32::NAN),
            Act::Bad => f32::NAN,
        }
    }

    /// `y[rows] = W x`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        if self.simd_kernel(x, y) {
            return;
        }
        let act = self.prepare(x);
        let y = &mut y[..self.rows];
        if self.rows * self.cols >= PAR_MIN {
            y.par_chunks_mut(64).enumerate().for_each(|(ci, ys)| {
                for (i, v) in ys.iter_mut().enumerate() {
                    *v = self.dot(ci * 64 + i, x, &act);
                }
            });
        } else {
            for (r, v) in y.iter_mut().enumerate() {
                *v = self.dot(r, x, &act);
            }
        }
    }

    /// K-quant, IQ and Q8_1-paired weights go to the SIMD kernels of `cpu_kernels` (one token
    /// per call, so batched and single-token results stay identical). F32, F16 and the Q8_0
    /// family stay on the exact path above: there the activation rounding must copy llama.cpp's
    /// x86 quantizer, which the shared kernels do not. Returns false to fall back.
    fn simd_kernel(&self, x: &[f32], y: &mut [f32]) -> bool {
        let vt = self.ty.vec_dot_type();
        if matches!(self.ty, GgmlType::F32 | GgmlType::F16) || vt == GgmlType::Q8_0 {
            return false;
        }
        let w = cpu_kernels::QTensor {
            ty: self.ty,
            data: self.data(),
            rows: self.rows,
            cols: self.cols,
        };
        cpu_kernels::try_matvec(&w, x, &mut y[..self.rows]).is_ok()
    }

    /// `y[n][rows] = x[n][cols] Wᵀ`. Tokens go in groups of up to 8 that share each weight row
    /// read ("fused read"); every element is the same `dot` as in [`Mat::matvec`].
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        if n > 0 && self.simd_kernel(&x[..cols], &mut y[..rows]) {
            for t in 1..n {
                self.matvec(
                    &x[t * cols..(t + 1) * cols],
                    &mut y[t * rows..(t + 1) * rows],
                );
            }
            return;
        }
        for g0 in (0..n).step_by(8) {
            let g = (n - g0).min(8);
            let acts: Vec<Act> = (0..g)
                .map(|t| self.prepare(&x[(g0 + t) * cols..(g0 + t + 1) * cols]))
                .collect();
            // Output for this group, row-major by weight row so rows can be split across threads.
            let mut tmp = vec![0f32; rows * g];
            let work = |(r, out): (usize, &mut [f32])| {
                for t in 0..g {
                    out[t] = self.dot(r, &x[(g0 + t) * cols..(g0 + t + 1) * cols], &acts[t]);
                }
            };
            if rows * cols * g >= PAR_MIN {
                tmp.par_chunks_mut(g).enumerate().for_each(work);
            } else {
                tmp.chunks_mut(g).enumerate().for_each(work);
            }
            for t in 0..g {
                for r in 0..rows {
                    y[(g0 + t) * rows + r] = tmp[r * g + t];
                }
            }
        }
    }
}

/// Q8_0 activation blocks as llama.cpp's x86 `quantize_row_q8_0` (AVX path) makes them: the
/// scale `d = amax/127` is stored as f16, but the quants are `round_half_even(x · (127/amax))`.
/// `quant::quantize_row` follows the scalar reference instead (`x · (1/d)`, ties away from
/// zero), which differs by one quant step now and then; on a Q8_0 model those flips are the
/// largest source of difference from llama.cpp's logits.
fn quantize_q8_0_x86(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        out.extend_from_slice(&quant::f32_to_f16(d).to_le_bytes());
        out.extend(
            b.iter()
                .map(|&v| ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8 as u8),
        );
    }
    out
}

/// Below this many multiply-adds a product stays on the calling thread.
const PAR_MIN: usize = 1 << 16;

enum Act {
    F32,
    Bytes(Vec<u8>),
    Bad,
}

/// f32 dot of little-endian f32 weight bytes with `x`; 8 partial sums (like a SIMD lane split).
// TODO(cpu-kernels): use the SIMD kernels once they land.
fn dot_f32_bytes(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = x.len() / 8 * 8;
    for (wc, xc) in w[..n8 * 4].chunks_exact(32).zip(x[..n8].chunks_exact(8)) {
        for l in 0..8 {
            let wv = f32::from_le_bytes([wc[4 * l], wc[4 * l + 1], wc[4 * l + 2], wc[4 * l + 3]]);
            acc[l] += wv * xc[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (wc, &xv) in w[n8 * 4..x.len() * 4].chunks_exact(4).zip(&x[n8..]) {
        s += f32::from_le_bytes([wc[0], wc[1], wc[2], wc[3]]) * xv;
    }
    s
}

// ------------------------------------------------------------------------------ f32 helpers

/// `out = x / sqrt(mean(x²) + eps) · γ` (γ optional): ggml's rms_norm, the shared
/// `cpu_kernels::rms_norm_ggml` (squares summed in f64); without γ the same with no multiply.
pub fn rms_norm(x: &[f32], gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    match gamma {
        Some(g) => cpu_kernels::rms_norm_ggml(x, g, eps, out),
        None => {
            let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
            let scale = 1.0 / ((sum / x.len() as f64) as f32 + eps).sqrt();
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = v * scale);
        }
    }
}

/// In-place [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], gamma: Option<&[f32]>, eps: f32) {
    let tmp = x.to_vec();
    rms_norm(&tmp, gamma, eps, x);
}

/// Precomputed NEOX rope angles for one position: `cos/sin(t·s^i)`, `s = base^(-2/n_rot)` in f32.
pub struct RopeAngles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeAngles {
    pub fn new(pos: usize, n_rot: usize, base: f32) -> RopeAngles {
        let half = n_rot / 2;
        let s = base.powf(-2.0 / n_rot as f32);
        let mut theta = pos as f32;
        let (mut cos, mut sin) = (Vec::with_capacity(half), Vec::with_capacity(half));
        for _ in 0..half {
            cos.push(theta.cos());
            sin.push(theta.sin());
            theta *= s;
        }
        RopeAngles { cos, sin }
    }

    /// Rotates the pairs `(x_i, x_{i+n_rot/2})` of one head; dims ≥ n_rot stay as they are.
    pub fn apply(&self, head: &mut [f32]) {
        let half = self.cos.len();
        for i in 0..half {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * self.cos[i] - x1 * self.sin[i];
            head[i + half] = x0 * self.sin[i] + x1 * self.cos[i];
        }
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub use cpu_kernels::silu;

/// ggml_softplus: `log(1 + e^x)`, linear above 20 where the exp would only add rounding.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

pub use crate::f16::round_f16;

/// Row-major `[n][len]` buffer helper: the `t`-th row.
pub fn row(buf: &[f32], t: usize, len: usize) -> &[f32] {
    &buf[t * len..(t + 1) * len]
}

pub fn row_mut(buf: &mut [f32], t: usize, len: usize) -> &mut [f32] {
    &mut buf[t * len..(t + 1) * len]
}
