//! Transcendental functions in plain f32 arithmetic (`+ - * /`, bit operations, no FMA, no
//! libm), so the host and the gfx11 kernels compute **bit-identical** results: Rust never
//! contracts `a * b + c`, IEEE `+ - * /` are correctly rounded on both, and the constants are
//! the same f32 literals. The GPU's ordered attention mode and its CPU reference
//! (`model::attention::attend_ordered`) both use [`expf`].
//!
//! Accuracy: [`expf`] is within 2 ulp of the exact exponential for normal results (Cody-Waite
//! reduction by ln 2, degree-7 Taylor polynomial on |r| <= 0.35, exact power-of-two scaling);
//! [`tanhf`] within ~1e-7 absolute.

use crate::util::nearest_int;

const LOG2E: f32 = core::f32::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI` is exact for |k| <= 256 (15 significant bits).
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);

/// `2^k` for -126 <= k <= 127.
#[inline(always)]
fn pow2i(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// e^x. NaN -> NaN, x > 88.72284 -> +inf, x < -103.98 -> +0, subnormal results rounded twice
/// (identically on host and device).
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > 88.722_84 {
        return f32::INFINITY;
    }
    if x < -103.98 {
        return 0.0;
    }
    let k = nearest_int(x * LOG2E);
    let kf = k as f32;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let mut p: f32 = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let e = 1.0 + (r + (r * r) * p);
    if k > 127 {
        e * 2.0 * pow2i(127)
    } else if k < -125 {
        e * pow2i(k + 64) * pow2i(-64)
    } else {
        e * pow2i(k)
    }
}

/// tanh(x) = sign(x) (1 - 2 / (e^{2|x|} + 1)); ±1 for |x| > 9.
#[inline(always)]
pub fn tanhf(x: f32) -> f32 {
    let a = crate::util::fabsf(x);
    let t = if a > 9.0 { 1.0 } else { 1.0 - 2.0 / (expf(2.0 * a) + 1.0) };
    if x < 0.0 { -t } else { t }
}

/// SiLU `x / (1 + e^-x)` with [`expf`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(-x))
}

/// GELU, tanh approximation (ggml's constants) with [`tanhf`].
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + tanhf(SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn expf_is_within_2_ulp_of_exp() {
        let mut x = -103.0f32;
        let mut worst = 0u32;
        while x < 88.7 {
            let got = expf(x);
            let want = (x as f64).exp() as f32;
            if want.is_normal() {
                let d = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
                worst = worst.max(d);
            }
            x += 0.001_37;
        }
        assert!(worst <= 2, "worst ulp distance {worst}");
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
        assert!(expf(f32::NAN).is_nan());
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn tanh_gelu_silu_close_to_f64() {
        let mut x = -12.0f32;
        while x < 12.0 {
            assert!((tanhf(x) as f64 - (x as f64).tanh()).abs() < 2e-7, "tanh {x}");
            let s = x as f64 / (1.0 + (-x as f64).exp());
            assert!((silu(x) as f64 - s).abs() <= 1e-6 * s.abs().max(1e-3), "silu {x}");
            x += 0.0123;
        }
    }
}
