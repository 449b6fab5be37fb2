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

/// Natural log for positive normal finite `x` (the only inputs its users pass: `1 + e^x`):
/// `x = 2^k m` with `m` in [√½, √2), `ln m = 2 atanh(f / (2 + f))` (f = m − 1, exact) as an odd
/// series to s⁹, then `k ln 2` in two parts. Within 2 ulp; x <= 0 gives NaN, +inf gives +inf.
#[inline(always)]
pub fn logf(x: f32) -> f32 {
    if x.is_nan() || x <= 0.0 {
        return f32::NAN;
    }
    if x == f32::INFINITY {
        return x;
    }
    let bits = x.to_bits();
    let mut k = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        k += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut p: f32 = 2.0 / 11.0;
    p = p * z + 2.0 / 9.0;
    p = p * z + 2.0 / 7.0;
    p = p * z + 2.0 / 5.0;
    p = p * z + 2.0 / 3.0;
    let lm = 2.0 * s + s * (z * p);
    let kf = k as f32;
    kf * LN2_HI + (kf * LN2_LO + lm)
}

/// `ln(1 + y)` for y >= 0, accurate for small y (Goldberg: `ln(u) · y / (u − 1)`, u = 1 + y).
#[inline(always)]
pub fn log1pf(y: f32) -> f32 {
    let u = 1.0 + y;
    if u == 1.0 { y } else { logf(u) * (y / (u - 1.0)) }
}

/// ggml's softplus `ln(1 + e^x)`, linear above 20, with [`expf`] and [`log1pf`].
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { log1pf(expf(x)) }
}

/// Logistic sigmoid `1 / (1 + e^-x)` with [`expf`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + expf(-x))
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
    fn logf_log1pf_softplus_sigmoid_close_to_f64() {
        let ulps = |got: f32, want: f32| (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs();
        let mut x = 1e-30f32;
        let mut worst = 0;
        while x < 1e30 {
            worst = worst.max(ulps(logf(x), (x as f64).ln() as f32));
            x *= 1.000_73;
        }
        assert!(worst <= 2, "logf worst ulp distance {worst}");
        assert_eq!(logf(1.0), 0.0);
        assert!(logf(0.0).is_nan() && logf(-1.0).is_nan() && logf(f32::NAN).is_nan());
        assert_eq!(logf(f32::INFINITY), f32::INFINITY);
        let mut y = 1e-12f32;
        while y < 1e9 {
            let want = (y as f64).ln_1p();
            let got = log1pf(y) as f64;
            assert!((got - want).abs() <= 4e-7 * want, "log1pf {y}: {got} vs {want}");
            y *= 1.0013;
        }
        let mut x = -30.0f32;
        while x < 30.0 {
            let want = if x > 20.0 { x as f64 } else { (x as f64).exp().ln_1p() };
            let got = softplus(x) as f64;
            assert!((got - want).abs() <= 5e-7 * want, "softplus {x}: {got} vs {want}");
            let sg = 1.0 / (1.0 + (-x as f64).exp());
            assert!((sigmoid(x) as f64 - sg).abs() <= 3e-7 * sg, "sigmoid {x}");
            x += 0.0173;
        }
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
