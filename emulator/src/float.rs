//! Floating-point helpers: f16/bf16 conversions (round to nearest even), IEEE-754-2008
//! minNum/maxNum as RDNA3 implements them in IEEE mode, denormal flushing, saturating
//! float->int conversion.

/// f16 bits -> f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // subnormal: value = man * 2^-24
            let v = man as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13) | if man != 0 { 0x40_0000 } else { 0 },
        _ => sign | ((exp as u32 + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 -> f16 bits, round to nearest even; NaN stays NaN (quiet).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) { r += 1; }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) { r += 1; }
    sign | r as u16
}

/// f32 -> f16 rounding toward zero (v_cvt_pk_rtz_f16_f32).
pub fn f32_to_f16_rtz(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f { return sign | 0x7bff; }
    if e <= 0 {
        if e < -10 { return sign; }
        return sign | ((man | 0x80_0000) >> (14 - e)) as u16;
    }
    sign | (((e as u32) << 10) | (man >> 13)) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 { f32::from_bits((h as u32) << 16) }
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() { return ((b >> 16) | 0x40) as u16; }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (r >> 16) as u16
}

/// Flush an f32 denormal to a signed zero.
#[inline(always)]
pub fn ftz(x: f32) -> f32 {
    if x.is_subnormal() { f32::from_bits(x.to_bits() & 0x8000_0000) } else { x }
}

fn quiet(x: f32) -> f32 { f32::from_bits(x.to_bits() | 0x40_0000) }

/// IEEE-mode min: a NaN operand yields the other operand; -0 < +0.
#[inline]
pub fn fmin(a: f32, b: f32) -> f32 {
    if a.is_nan() { return if b.is_nan() { quiet(a) } else { b }; }
    if b.is_nan() { return a; }
    if a == b { return if a.is_sign_negative() { a } else { b }; }
    if a < b { a } else { b }
}
#[inline]
pub fn fmax(a: f32, b: f32) -> f32 {
    if a.is_nan() { return if b.is_nan() { quiet(a) } else { b }; }
    if b.is_nan() { return a; }
    if a == b { return if a.is_sign_negative() { b } else { a }; }
    if a > b { a } else { b }
}
pub fn fmin64(a: f64, b: f64) -> f64 {
    if a.is_nan() { return b; }
    if b.is_nan() { return a; }
    if a == b { return if a.is_sign_negative() { a } else { b }; }
    a.min(b)
}
pub fn fmax64(a: f64, b: f64) -> f64 {
    if a.is_nan() { return b; }
    if b.is_nan() { return a; }
    if a == b { return if a.is_sign_negative() { b } else { a }; }
    a.max(b)
}
/// Median of three with IEEE NaN handling (NaN inputs behave like in min/max chains).
pub fn fmed3(a: f32, b: f32, c: f32) -> f32 {
    if a.is_nan() || b.is_nan() || c.is_nan() {
        return fmin(fmin(a, b), c);
    }
    fmax(fmin(a, b), fmin(fmax(a, b), c))
}

/// Saturating f32 -> i32 (NaN -> 0), truncating toward zero.
pub fn f2i(x: f32) -> i32 { if x.is_nan() { 0 } else { x as i32 } }
pub fn f2u(x: f32) -> u32 { if x.is_nan() { 0 } else { x as u32 } }
pub fn d2i(x: f64) -> i32 { if x.is_nan() { 0 } else { x as i32 } }
pub fn d2u(x: f64) -> u32 { if x.is_nan() { 0 } else { x as u32 } }

/// frexp: mantissa in [0.5, 1) and exponent; (x, 0) for 0/inf/NaN.
pub fn frexp(x: f32) -> (f32, i32) {
    if x == 0.0 || !x.is_finite() { return (x, 0); }
    let (m, e) = if x.is_subnormal() { (x * 2f32.powi(64), -64) } else { (x, 0) };
    let b = m.to_bits();
    let exp = ((b >> 23) & 0xff) as i32 - 126;
    (f32::from_bits((b & 0x807f_ffff) | (126 << 23)), exp + e)
}
pub fn frexp64(x: f64) -> (f64, i32) {
    if x == 0.0 || !x.is_finite() { return (x, 0); }
    let (m, e) = if x.is_subnormal() { (x * 2f64.powi(128), -128) } else { (x, 0) };
    let b = m.to_bits();
    let exp = ((b >> 52) & 0x7ff) as i32 - 1022;
    (f64::from_bits((b & 0x800f_ffff_ffff_ffff) | (1022 << 52)), exp + e)
}
pub fn ldexp(x: f32, e: i32) -> f32 {
    // two steps keep intermediate scale factors representable
    let e = e.clamp(-400, 400);
    let h = e / 2;
    x * 2f32.powi(h) * 2f32.powi(e - h)
}
pub fn ldexp64(x: f64, e: i32) -> f64 {
    let e = e.clamp(-2200, 2200);
    let h = e / 2;
    x * 2f64.powi(h) * 2f64.powi(e - h)
}
/// Round half to even.
pub fn rndne(x: f32) -> f32 { x.round_ties_even() }
pub fn fract(x: f32) -> f32 {
    if !x.is_finite() { return if x.is_nan() { x } else { f32::NAN }; }
    (x - x.floor()).min(f32::from_bits(0x3f7f_ffff))
}

/// Lane-wise fused multiply-add. `f32::mul_add` is a libm call unless the CPU's FMA unit is
/// enabled at compile time, so use it through a runtime-detected `target_feature` path.
pub fn fma_lanes(a: &[f32; 32], b: &[f32; 32], c: &[f32; 32]) -> [f32; 32] {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS_FMA: OnceLock<bool> = OnceLock::new();
        if *HAS_FMA.get_or_init(|| std::arch::is_x86_feature_detected!("fma")) {
            // SAFETY: the CPU supports FMA (checked above); the function only does arithmetic.
            return unsafe { fma_lanes_fma(a, b, c) };
        }
    }
    let mut r = [0f32; 32];
    for l in 0..32 { r[l] = a[l].mul_add(b[l], c[l]); }
    r
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn fma_lanes_fma(a: &[f32; 32], b: &[f32; 32], c: &[f32; 32]) -> [f32; 32] {
    let mut r = [0f32; 32];
    for l in 0..32 { r[l] = a[l].mul_add(b[l], c[l]); }
    r
}
