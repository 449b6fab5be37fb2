//! Flash-Next's products and f32 helpers on the CPU: [`Mat::matmul`] on the CPU executor's
//! kernels in llama.cpp's x86 float order (the shared decoders' exact path), with every output
//! element the same function of its row and token for any batch size; and the small helpers
//! whose rounding matters: RMSNorm sums squares in f64 (`ggml_float`), rope angles are built
//! iteratively in f32 (`θ_i = t·s^i`).

use quant::GgmlType;

use model::qwen4exp::Mat;

/// The CPU executor's methods on [`Mat`] (a type of the `model` crate, which knows no backend).
pub trait MatCpu {
    /// `y[rows] = W x`.
    fn matvec(&self, x: &[f32], y: &mut [f32]);

    /// `y[n][rows] = x[n][cols] Wᵀ`, through the CPU executor's kernels: llama.cpp's x86 float
    /// order (`cpu_kernels::matmul_ggml`, as the shared decoders' exact path), and the
    /// reference order (`cpu::matmul_ordered`) for types without such a kernel. Every output
    /// element is the same function of its weight row and token whatever `n` is, so a batched
    /// pass is bit-identical to token-by-token passes: llama.cpp orders K-quant products of
    /// several tokens (its 4-row GEMM, its tiled GEMM from 8) unlike one token's (its GEMV),
    /// so those run one token at a time.
    fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]);
}

impl MatCpu for Mat {
    fn matvec(&self, x: &[f32], y: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        self.matmul(x, 1, y);
    }

    fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let (x, y) = (&x[..n * cols], &mut y[..n * rows]);
        let w = self.qt();
        let per_token = matches!(self.ty, GgmlType::Q4K | GgmlType::Q6K) && n > 1;
        if !cpu_kernels::SUPPORTED_TYPES.contains(&self.ty) {
            if let Err(e) = crate::matmul_ordered(&w, x, n, y) {
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
