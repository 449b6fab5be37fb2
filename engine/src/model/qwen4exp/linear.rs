//! Weight matrices as the qwen4exp layers see them, and the small f32 helpers (RMSNorm, NEOX
//! rope, activations, f16 rounding) shared by the layer modules.
//!
//! A [`Mat`] is a row-major matrix in any ggml block type, either owned (tests, synthetic
//! layers) or a window into a memory-mapped [`gguf::GgufFile`] (so a multi-gigabyte model is
//! never copied). Its products run on the CPU executor's kernels in llama.cpp's x86 float order
//! (the shared decoders' exact path, [`Mat::matmul`]), with every output element the same
//! function of its row and token for any batch size.
//!
//! The f32 helpers copy the ggml formulas where rounding matters: RMSNorm sums squares in f64
//! (`ggml_float`), rope angles are built iteratively in f32 (`θ_i = t·s^i`).

use std::sync::Arc;

use gguf::GgufFile;
use quant::GgmlType;

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

    /// The matrix as a `cpu_kernels` operand.
    pub fn qt(&self) -> cpu_kernels::QTensor<'_> {
        cpu_kernels::QTensor { ty: self.ty, data: self.data(), rows: self.rows, cols: self.cols }
    }

    /// `y[rows] = W x`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        self.matmul(x, 1, y);
    }

    /// `y[n][rows] = x[n][cols] Wᵀ`, through the CPU executor's kernels: llama.cpp's x86 float
    /// order (`cpu_kernels::matmul_ggml`, as the shared decoders' exact path), and the
    /// reference order (`cpu::matmul_ordered`) for types without such a kernel. Every output
    /// element is the same function of its weight row and token whatever `n` is, so a batched
    /// pass is bit-identical to token-by-token passes: llama.cpp orders K-quant products of
    /// several tokens (its 4-row GEMM, its tiled GEMM from 8) unlike one token's (its GEMV),
    /// so those run one token at a time.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let (x, y) = (&x[..n * cols], &mut y[..n * rows]);
        let w = self.qt();
        let per_token = matches!(self.ty, GgmlType::Q4K | GgmlType::Q6K) && n > 1;
        if !cpu_kernels::SUPPORTED_TYPES.contains(&self.ty) {
            if let Err(e) = crate::cpu::matmul_ordered(&w, x, n, y) {
                y.fill(f32::NAN); // unreachable: the geometry was validated at construction
                debug_assert!(false, "{self:?}: {e}");
            }
        } else if per_token {
            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                cpu_kernels::matmul_ggml(&w, xt, 1, yt);
            }
        } else {
            cpu_kernels::matmul_ggml(&w, x, n, y);
        }
    }
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
