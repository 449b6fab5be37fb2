//! Element-wise and row operations: RMS norm, rotary embeddings (ggml semantics), softmax and the
//! gated activations. These run on vectors of a few thousand elements per token, so plain loops
//! that LLVM vectorises are enough; the math follows ggml so logits match llama.cpp.

/// `out = x / sqrt(mean(x^2) + eps) * weight` (ggml `rms_norm` followed by the weight multiply).
/// The sum of squares is accumulated in f64 like ggml's `ggml_float`, so long rows lose nothing.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(weight.len()).min(out.len());
    if n == 0 {
        return;
    }
    // Eight f64 partial sums keep the loop vectorisable (f64 adds are not reassociated otherwise).
    let mut part = [0f64; 8];
    let mut chunks = x[..n].chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            part[i] += (c[i] as f64) * (c[i] as f64);
        }
    }
    let mut sum: f64 = part.iter().sum();
    for &v in chunks.remainder() {
        sum += (v as f64) * (v as f64);
    }
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    for i in 0..n {
        out[i] = x[i] * scale * weight[i];
    }
}

/// RMS norm in place, without a weight (`ggml_rms_norm` alone).
pub fn rms_norm_inplace(x: &mut [f32], eps: f32) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= scale);
}

/// Rotation angles for one position: `theta_i = pos * freq_scale * freq_base^(-2i/rot_dim)`,
/// i < rot_dim/2. ggml computes the power iteratively in f32 (`theta *= theta_scale`); we use
/// `powf` per index, which is closer to the exact value (difference ~1e-6 relative at i = 63).
fn rope_cos_sin(rot_dim: usize, pos: usize, freq_base: f32, freq_scale: f32, cs: &mut Vec<(f32, f32)>) {
    cs.clear();
    let half = rot_dim / 2;
    for i in 0..half {
        let inv = (freq_base as f64).powf(-2.0 * i as f64 / rot_dim as f64);
        let theta = pos as f64 * freq_scale as f64 * inv;
        cs.push((theta.cos() as f32, theta.sin() as f32));
    }
}

/// NEOX-style rotary embedding in place on `x = [n_heads][head_dim]`: dimension i is rotated
/// with dimension i + rot_dim/2 (i < rot_dim/2); dimensions >= rot_dim are left unchanged.
pub fn rope_neox(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
) {
    let rot_dim = rot_dim.min(head_dim) & !1;
    let half = rot_dim / 2;
    let mut cs = Vec::with_capacity(half);
    rope_cos_sin(rot_dim, pos, freq_base, freq_scale, &mut cs);
    for h in x.chunks_exact_mut(head_dim).take(n_heads) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (a, b) = (h[i], h[i + half]);
            h[i] = a * c - b * s;
            h[i + half] = a * s + b * c;
        }
    }
}

/// Normal (GPT-J / llama) rotary embedding in place: pairs (2i, 2i+1) for 2i < rot_dim.
pub fn rope_norm(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
) {
    let rot_dim = rot_dim.min(head_dim) & !1;
    let mut cs = Vec::with_capacity(rot_dim / 2);
    rope_cos_sin(rot_dim, pos, freq_base, freq_scale, &mut cs);
    for h in x.chunks_exact_mut(head_dim).take(n_heads) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (a, b) = (h[2 * i], h[2 * i + 1]);
            h[2 * i] = a * c - b * s;
            h[2 * i + 1] = a * s + b * c;
        }
    }
}

/// Numerically stable softmax in place (max subtracted first). An all `-inf` row becomes all 0
/// instead of NaN, so fully masked attention rows stay harmless.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// SiLU: x * sigmoid(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// `out[i] = silu(gate[i]) * up[i]`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `out[i] = gelu_tanh(gate[i]) * up[i]` (Gemma's feed-forward).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// Logit soft-capping (Gemma 2): `cap * tanh(x / cap)` in place.
pub fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

// ---- Bit-exact copies of llama.cpp's CPU ops (x86 build with GCC, which contracts a*b + c
// into FMAs). Gemma 3's logits move by ~0.1 when a single activation quant flips, so matching
// llama.cpp token for token needs the same rounding everywhere, not just the same math.

/// ggml `rms_norm` (+ the fused weight multiply): squares rounded to f32, summed in order in
/// f64, `scale = 1/sqrtf(mean + eps)`, `y = x * scale * w`.
pub fn rms_norm_ggml(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(weight.len()).min(out.len());
    if n == 0 {
        return;
    }
    let mut sum = 0f64;
    for &v in &x[..n] {
        sum += (v * v) as f64;
    }
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    for i in 0..n {
        out[i] = x[i] * scale * weight[i];
    }
}

/// ggml NEOX rope: angles from the f32 recurrence `theta *= powf(base, -2/n_dims)` (not powf
/// per index), `cosf`/`sinf` in f32, and the rotation as GCC compiles it:
/// `fma(a, cos, -(b*sin))`, `fma(a, sin, b*cos)`.
pub fn rope_neox_ggml(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
) {
    let mut cs = Vec::new();
    rope_cs_ggml(rot_dim.min(head_dim), pos, freq_base, freq_scale, &mut cs);
    rope_neox_ggml_cs(x, n_heads, head_dim, &cs);
}

/// The `(cos, sin)` pairs [`rope_neox_ggml`] uses at position `pos` (`rot_dim / 2` of them),
/// appended to `out`: compute them once per position and reuse them for Q and K of every layer
/// with the same base and scale ([`rope_neox_ggml_cs`]).
pub fn rope_cs_ggml(rot_dim: usize, pos: usize, freq_base: f32, freq_scale: f32, out: &mut Vec<(f32, f32)>) {
    let rot_dim = rot_dim & !1;
    let half = rot_dim / 2;
    let theta_scale = freq_base.powf(-2.0 / rot_dim as f32);
    let mut theta = pos as f32;
    for _ in 0..half {
        let t = freq_scale * theta;
        out.push((t.cos(), t.sin()));
        theta *= theta_scale;
    }
}

/// [`rope_neox_ggml`] with precomputed angles from [`rope_cs_ggml`] (`cs.len()` = rot_dim / 2).
pub fn rope_neox_ggml_cs(x: &mut [f32], n_heads: usize, head_dim: usize, cs: &[(f32, f32)]) {
    #[cfg(target_arch = "x86_64")]
    if crate::float::has_fma() {
        // SAFETY: FMA is present (checked).
        return unsafe { rope_rotate_fma(x, n_heads, head_dim, cs) };
    }
    rope_rotate(x, n_heads, head_dim, cs)
}

#[inline(always)]
fn rope_rotate(x: &mut [f32], n_heads: usize, head_dim: usize, cs: &[(f32, f32)]) {
    let half = cs.len().min(head_dim / 2);
    for h in x.chunks_exact_mut(head_dim).take(n_heads) {
        for (i, &(c, s)) in cs[..half].iter().enumerate() {
            let (a, b) = (h[i], h[i + half]);
            h[i] = a.mul_add(c, -(b * s));
            h[i + half] = a.mul_add(s, b * c);
        }
    }
}

/// `mul_add` inlined as FMA instructions instead of `fmaf` calls.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_rotate_fma(x: &mut [f32], n_heads: usize, head_dim: usize, cs: &[(f32, f32)]) {
    rope_rotate(x, n_heads, head_dim, cs)
}

/// f16-rounded `gelu(h)` for every f16 value `h` (ggml's `ggml_table_gelu_f16`), as f32.
/// The f16 GELU table of [`geglu_ggml`]: entry `h` = f16-rounded `gelu(f16 h)` (65536 f32),
/// for backends that must reproduce it bit for bit (the GPU's ordered mode uploads it).
pub fn gelu_f16_table() -> &'static [f32] {
    gelu_table()
}

fn gelu_table() -> &'static [f32] {
    use std::sync::OnceLock;
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| {
        const S: f32 = 0.797_884_6;
        const A: f32 = 0.044715;
        (0..=u16::MAX)
            .map(|bits| {
                let h = quant::f16_to_f32(bits);
                let ge = 0.5 * h * (1.0 + (S * h * (A * h).mul_add(h, 1.0)).tanh());
                quant::f16_to_f32(quant::f32_to_f16(ge))
            })
            .collect()
    })
}

/// ggml's `geglu` with `GGML_GELU_FP16`: the gate is rounded to f16 and looked up in a table of
/// f16-rounded `gelu(f16)` values (computed with GCC's FMA contraction of `1 + A*x*x`);
/// 0 below -10, identity above 10.
pub fn geglu_ggml(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let t = gelu_table();
    #[cfg(target_arch = "x86_64")]
    if crate::x86::cpu::has_avx2() {
        // SAFETY: AVX2/F16C present (checked).
        return unsafe { geglu_ggml_f16c(t, gate, up, out) };
    }
    geglu_ggml_scalar(t, gate, up, out)
}

/// [`geglu_ggml`] with the f32 -> f16 rounding done 8 at a time by F16C (same values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(unsafe_op_in_unsafe_fn)]
unsafe fn geglu_ggml_f16c(t: &[f32], gate: &[f32], up: &[f32], out: &mut [f32]) {
    use core::arch::x86_64::*;
    let n = out.len().min(gate.len()).min(up.len());
    let n8 = n & !7;
    let mut h = [0u16; 8];
    for i in (0..n8).step_by(8) {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        _mm_storeu_si128(h.as_mut_ptr().cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(g));
        for l in 0..8 {
            let (g, u) = (gate[i + l], up[i + l]);
            out[i + l] = if g <= -10.0 {
                0.0
            } else if g >= 10.0 {
                g * u
            } else {
                t[h[l] as usize] * u
            };
        }
    }
    geglu_ggml_scalar(t, &gate[n8..n], &up[n8..n], &mut out[n8..n])
}

fn geglu_ggml_scalar(t: &[f32], gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            t[quant::f32_to_f16(g) as usize] * u
        };
    }
}
