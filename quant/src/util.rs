//! Small numeric helpers shared by the quantizers, written on `core` only (no libm), so they
//! behave identically on the host and on amdgcn.

/// `|x|` by clearing the sign bit (ggml's `fabsf`).
#[inline(always)]
pub fn fabsf(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7fff_ffff)
}

/// ggml's `nearest_int`: round to nearest, ties to even, for |x| <= 2^22.
///
/// Adding 1.5·2^23 puts the integer part of `x` into the low mantissa bits of the sum (the
/// FPU's round-to-nearest-even does the rounding); the bits are then read back. The caller
/// must pass an already-rounded f32 product: no fused multiply-add may feed this (llama.cpp's
/// `nearest_int(iscale*x)` rounds the product first).
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C's `roundf` (half away from zero) for values that fit an i32, returned as i32.
/// Used by the Q8_0/Q8_1 quantizers (llama.cpp stores `roundf(x*id)` into an int8).
#[inline(always)]
pub fn roundf_i32(x: f32) -> i32 {
    let t = x as i32; // truncation toward zero (saturating; NaN → 0)
    let frac = x - t as f32; // exact for |x| < 2^24
    // Wrapping: out of i32 range (an inf or NaN block, whose int8 llama.cpp leaves as the low
    // byte of x86's 0x80000000, i.e. 0) the release build has always wrapped and the vectors
    // match that; a debug build must not trap on it.
    if frac >= 0.5 {
        t.wrapping_add(1)
    } else if frac <= -0.5 {
        t.wrapping_sub(1)
    } else {
        t
    }
}

/// Correctly rounded `sqrtf` for non-negative `x` (NaN for negative input).
///
/// Only the quantizers need it (ggml's `sqrtf(sum_x2/32)` in the K-quant reference
/// quantizers), so it favours exactness over speed: an integer square root of the scaled
/// significand, rounded to nearest (an exact tie is impossible for square roots).
pub fn sqrtf(x: f32) -> f32 {
    let b = x.to_bits();
    if x == 0.0 || x.is_nan() || b == 0x7f80_0000 {
        return x; // ±0, NaN, +inf
    }
    if b >> 31 != 0 {
        return f32::NAN;
    }
    // x = m * 2^e with integer m.
    let exp = (b >> 23) as i32;
    let man = (b & 0x7f_ffff) as u64;
    let (mut m, mut e) = if exp == 0 { (man, -149) } else { (man | 0x80_0000, exp - 150) };
    while m < 0x80_0000 {
        m <<= 1; // normalise subnormals to a 24-bit significand
        e -= 1;
    }
    // Scale so that the exponent is even and big = m * 2^s lies in [2^46, 2^48): its root then
    // has exactly 24 bits.
    let s = if e & 1 == 0 { 24 } else { 23 };
    let big = m << s;
    let e2 = (e - s) / 2;
    let mut r = isqrt_u64(big);
    // sqrt(big) > r + 1/2  <=>  big > r^2 + r + 1/4  <=>  big - r^2 > r (integers).
    if big - r * r > r {
        r += 1;
    }
    let mut e2 = e2;
    if r == 1 << 24 {
        r >>= 1;
        e2 += 1;
    }
    let biased = (e2 + 23 + 127) as u32; // roots of f32 values are >= 2^-75: always normal
    f32::from_bits((biased << 23) | (r as u32 & 0x7f_ffff))
}

/// floor(sqrt(v)) for u64, by Newton's method from an upper bound.
fn isqrt_u64(v: u64) -> u64 {
    if v < 2 {
        return v;
    }
    let shift = (64 - v.leading_zeros()).div_ceil(2);
    let mut x = 1u64 << shift; // > sqrt(v)
    loop {
        let y = (x + v / x) / 2;
        if y >= x {
            return x;
        }
        x = y;
    }
}

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below this quantize to zero.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qkx2_quants`: fit `x ≈ scale * L - min` (`L` in `0..=nmax`, `min >= 0`) by a
/// weighted least-squares search over `nstep + 1` trial inverse scales
/// `(rmin + rdelta*is + nmax) / (max - min)`. Writes `l` and returns `(scale, min)`.
///
/// Float expressions are evaluated in ggml's order (no fused multiply-add), so the result is
/// the same as the C reference quantizer's.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len().min(weights.len()).min(l.len()).min(32);
    if n == 0 {
        return (0.0, 0.0);
    }
    let mut laux = [0u8; 32];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let mut diff = scale * q as f32 + min - x[i];
        diff = if use_mad { fabsf(diff) } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * laux[i] as f32 + this_min - x[i];
                diff = if use_mad { fabsf(diff) } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (weights `x²`):
/// symmetric fit `x ≈ scale * (L - nmax)`, `L` in `0..2*nmax`, searching 18 trial scales
/// around `-nmax/max`. Writes `l` (offset by `nmax`) and returns the scale.
pub fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let n = x.len().min(l.len());
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in &x[..n] {
        let ax = fabsf(v);
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let q = quant(iscale, x[i]);
        l[i] = (q + nmax) as u8;
        let w = x[i] * x[i];
        let qf = q as f32;
        sumlx += w * x[i] * qf;
        suml2 += w * qf * qf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in &x[..n] {
            let qf = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * qf;
            suml2 += w * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l[i] = (quant(iscale, x[i]) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}
