//! Flash-Next's f32 helpers on the CPU, the small ones whose rounding matters: RMSNorm sums
//! squares in f64 (`ggml_float`); rope is the shared ggml rope (iterative f32 angles, FMA
//! rotation). Its products are [`crate::MatCpu`]'s.

pub use crate::mat::MatCpu;
use model::Mat;

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

/// Flash-Next's NEOX rope is the shared decoders' ggml rope: angles from
/// [`cpu_kernels::rope_cs_ggml`] (the f32 recurrence `θ_i = t·s^i`), rotation
/// [`cpu_kernels::rope_neox_ggml_cs`] (`fma(a, cos, -(b·sin))`, `fma(a, sin, b·cos)`).
/// `(cos, sin)` pairs of position `pos` for `n_rot` roped dims.
pub fn rope_angles(pos: usize, n_rot: usize, base: f32) -> Vec<(f32, f32)> {
    let mut cs = Vec::with_capacity(n_rot / 2);
    cpu_kernels::rope_cs_ggml(n_rot, pos, base, 1.0, &mut cs);
    cs
}

/// Rotates the NEOX pairs `(x_i, x_{i+n_rot/2})` of one head with [`rope_angles`]; dims
/// `>= n_rot` stay as they are.
pub fn rope_head(head: &mut [f32], cs: &[(f32, f32)]) {
    cpu_kernels::rope_neox_ggml_cs(head, 1, head.len(), cs);
}

/// The float order the CPU runs Flash-Next in: llama.cpp's (SIMD products, libm's exp), or the
/// ordered-numerics mode's (`--ordered`), the device's own: every product
/// [`crate::matmul_ordered`] (`quant::quantize_row` + `quant::vec_dot`, as `mmv_ordered`), every
/// exp / sigmoid / SiLU / softplus `quant::fmath`'s (what the device kernels call), the MoE
/// softmax in `moe_router`'s order and the expert outputs added in rank order (`moe_combine`).
/// The sums between them are already in the device kernels' order in both modes.
/// (`Numerics::Tiles` is a prompt-product choice of the shared decoder: here as `Llama`.)
pub use model::loaded::Numerics;

/// The CPU's element-wise functions and products in a [`Numerics`] mode.
pub trait NumericsCpu: Copy {
    fn exp(self, x: f32) -> f32;
    fn sigmoid(self, x: f32) -> f32;
    fn silu(self, x: f32) -> f32;
    fn softplus(self, x: f32) -> f32;
    /// `y[n][rows] = x[n][cols] Wᵀ`: [`MatCpu::matmul`], or the reference order.
    fn matmul(self, w: &Mat, x: &[f32], n: usize, y: &mut [f32]);
}

impl NumericsCpu for Numerics {
    fn exp(self, x: f32) -> f32 {
        if self == Numerics::Ordered { quant::fmath::expf(x) } else { x.exp() }
    }

    fn sigmoid(self, x: f32) -> f32 {
        if self == Numerics::Ordered { quant::fmath::sigmoid(x) } else { sigmoid(x) }
    }

    fn silu(self, x: f32) -> f32 {
        if self == Numerics::Ordered { quant::fmath::silu(x) } else { silu(x) }
    }

    fn softplus(self, x: f32) -> f32 {
        if self == Numerics::Ordered { quant::fmath::softplus(x) } else { softplus(x) }
    }

    fn matmul(self, w: &Mat, x: &[f32], n: usize, y: &mut [f32]) {
        if self != Numerics::Ordered {
            return w.matmul(x, n, y);
        }
        let (x, y) = (&x[..n * w.cols], &mut y[..n * w.rows]);
        if let Err(e) = crate::matmul_ordered(&w.qt(), x, n, y) {
            y.fill(f32::NAN); // unreachable: the geometry was validated at construction
            debug_assert!(false, "{w:?}: {e}");
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
