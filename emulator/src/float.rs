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
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        r += 1;
    }
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
    if e >= 0x1f {
        return sign | 0x7bff;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        return sign | ((man | 0x80_0000) >> (14 - e)) as u16;
    }
    sign | (((e as u32) << 10) | (man >> 13)) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (r >> 16) as u16
}

/// Flush an f32 denormal to a signed zero.
#[inline(always)]
pub fn ftz(x: f32) -> f32 {
    if x.is_subnormal() { f32::from_bits(x.to_bits() & 0x8000_0000) } else { x }
}

fn quiet(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x40_0000)
}

/// IEEE-mode min: a NaN operand yields the other operand; -0 < +0.
#[inline]
pub fn fmin(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        return if b.is_nan() { quiet(a) } else { b };
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        return if a.is_sign_negative() { a } else { b };
    }
    if a < b { a } else { b }
}
#[inline]
pub fn fmax(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        return if b.is_nan() { quiet(a) } else { b };
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        return if a.is_sign_negative() { b } else { a };
    }
    if a > b { a } else { b }
}
pub fn fmin64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        return if a.is_sign_negative() { a } else { b };
    }
    a.min(b)
}
pub fn fmax64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        return if a.is_sign_negative() { b } else { a };
    }
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
pub fn f2i(x: f32) -> i32 {
    if x.is_nan() { 0 } else { x as i32 }
}
pub fn f2u(x: f32) -> u32 {
    if x.is_nan() { 0 } else { x as u32 }
}
pub fn d2i(x: f64) -> i32 {
    if x.is_nan() { 0 } else { x as i32 }
}
pub fn d2u(x: f64) -> u32 {
    if x.is_nan() { 0 } else { x as u32 }
}

/// frexp: mantissa in [0.5, 1) and exponent; (x, 0) for 0/inf/NaN.
pub fn frexp(x: f32) -> (f32, i32) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let (m, e) = if x.is_subnormal() { (x * 2f32.powi(64), -64) } else { (x, 0) };
    let b = m.to_bits();
    let exp = ((b >> 23) & 0xff) as i32 - 126;
    (f32::from_bits((b & 0x807f_ffff) | (126 << 23)), exp + e)
}
pub fn frexp64(x: f64) -> (f64, i32) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let (m, e) = if x.is_subnormal() { (x * 2f64.powi(128), -128) } else { (x, 0) };
    let b = m.to_bits();
    let exp = ((b >> 52) & 0x7ff) as i32 - 1022;
    (f64::from_bits((b & 0x800f_ffff_ffff_ffff) | (1022 << 52)), exp + e)
}
/// `x * 2^e` rounded once (ISA: `S0.f * 2.0F ** S1.i`). Exact in f64 for every exponent that
/// matters (results beyond +-400 binades are 0 or inf anyway), then one f64 -> f32 rounding:
/// two scaling steps in f32 would round twice in the denormal range.
pub fn ldexp(x: f32, e: i32) -> f32 {
    let e = e.clamp(-400, 400);
    (x as f64 * 2f64.powi(e)) as f32
}
/// f64 `x * 2^e` rounded once: scaled exactly while the result stays normal, one final
/// multiplication when it is a denormal.
pub fn ldexp64(x: f64, e: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let (m, k) = frexp64(x); // x = m * 2^k, 0.5 <= |m| < 1
    let t = k as i64 + e as i64;
    if t > 1024 {
        return if x < 0.0 { f64::NEG_INFINITY } else { f64::INFINITY };
    }
    if t >= -1021 {
        return (m * 2.0) * 2f64.powi(t as i32 - 1);
    }
    // denormal or zero result: m * 2^-1000 is exact, the second factor rounds once
    let t = t.max(-1100) as i32;
    m * 2f64.powi(-1000) * 2f64.powi(t + 1000)
}
/// Round half to even.
pub fn rndne(x: f32) -> f32 {
    x.round_ties_even()
}
/// `S0 + -floor(S0)`, clamped below 1.0 (inf - inf is the default NaN).
pub fn fract(x: f32) -> f32 {
    if !x.is_finite() {
        return if x.is_nan() { quiet32(x) } else { f32::from_bits(DEFAULT_NAN32) };
    }
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
    for l in 0..32 {
        r[l] = a[l].mul_add(b[l], c[l]);
    }
    r
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn fma_lanes_fma(a: &[f32; 32], b: &[f32; 32], c: &[f32; 32]) -> [f32; 32] {
    let mut r = [0f32; 32];
    for l in 0..32 {
        r[l] = a[l].mul_add(b[l], c[l]);
    }
    r
}

// ---------------------------------------------------------------- ISA special values
// (RDNA3 ISA pseudo-code; docs/emulator.md "ISA conformance")

/// The NaN the hardware generates (ISA: `V_LOG_F32(-1.0) => 0xffc00000`, `v_div_fixup` 0/0):
/// negative, quiet, no payload. f16: 0xfe00, f64: 0xfff8000000000000.
pub const DEFAULT_NAN32: u32 = 0xffc0_0000;
pub const DEFAULT_NAN16: u16 = 0xfe00;
pub const DEFAULT_NAN64: u64 = 0xfff8_0000_0000_0000;

#[inline]
pub fn is_snan32(x: f32) -> bool {
    x.is_nan() && x.to_bits() & 0x40_0000 == 0
}
#[inline]
pub fn is_snan64(x: f64) -> bool {
    x.is_nan() && x.to_bits() & (1 << 51) == 0
}
#[inline]
pub fn quiet32(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x40_0000)
}
#[inline]
pub fn quiet64(x: f64) -> f64 {
    f64::from_bits(x.to_bits() | (1 << 51))
}

/// A transcendental result: a NaN from a NaN input is that input quieted, a NaN from a number
/// (sqrt(-1), log(-1), sin(inf)) is the default NaN.
#[inline]
pub fn nan_result32(input: f32, r: f32) -> f32 {
    if !r.is_nan() {
        r
    } else if input.is_nan() {
        quiet32(input)
    } else {
        f32::from_bits(DEFAULT_NAN32)
    }
}

/// v_min_f32 (ISA pseudo-code, IEEE and non-IEEE mode): in IEEE mode a signalling NaN operand
/// gives that NaN quieted, a quiet NaN gives the other operand; otherwise a NaN gives the other
/// operand; -0 < +0.
#[inline]
pub fn min_ieee(a: f32, b: f32, ieee: bool) -> f32 {
    if let Some(r) = nan_rule32(a, b, ieee) {
        return r;
    }
    let lt = a < b || (a == 0.0 && b == 0.0 && a.is_sign_negative() && !b.is_sign_negative());
    if lt { a } else { b }
}
#[inline]
pub fn max_ieee(a: f32, b: f32, ieee: bool) -> f32 {
    if let Some(r) = nan_rule32(a, b, ieee) {
        return r;
    }
    let gt = a > b || (a == 0.0 && b == 0.0 && !a.is_sign_negative() && b.is_sign_negative());
    if gt { a } else { b }
}
#[inline]
fn nan_rule32(a: f32, b: f32, ieee: bool) -> Option<f32> {
    if ieee {
        if is_snan32(a) {
            return Some(quiet32(a));
        }
        if is_snan32(b) {
            return Some(quiet32(b));
        }
    }
    if b.is_nan() {
        return Some(a);
    }
    if a.is_nan() {
        return Some(b);
    }
    None
}
/// v_med3_f32: any NaN -> min3; else the maximum's two partners' maximum (IEEE `==`, so
/// ±0 compare equal).
pub fn med3_ieee(a: f32, b: f32, c: f32, ieee: bool) -> f32 {
    if a.is_nan() || b.is_nan() || c.is_nan() {
        return min_ieee(min_ieee(a, b, ieee), c, ieee);
    }
    let m = max_ieee(max_ieee(a, b, ieee), c, ieee);
    if m == a {
        max_ieee(b, c, ieee)
    } else if m == b {
        max_ieee(a, c, ieee)
    } else {
        max_ieee(a, b, ieee)
    }
}

pub fn min64_ieee(a: f64, b: f64, ieee: bool) -> f64 {
    if let Some(r) = nan_rule64(a, b, ieee) {
        return r;
    }
    let lt = a < b || (a == 0.0 && b == 0.0 && a.is_sign_negative() && !b.is_sign_negative());
    if lt { a } else { b }
}
pub fn max64_ieee(a: f64, b: f64, ieee: bool) -> f64 {
    if let Some(r) = nan_rule64(a, b, ieee) {
        return r;
    }
    let gt = a > b || (a == 0.0 && b == 0.0 && !a.is_sign_negative() && b.is_sign_negative());
    if gt { a } else { b }
}
fn nan_rule64(a: f64, b: f64, ieee: bool) -> Option<f64> {
    if ieee {
        if is_snan64(a) {
            return Some(quiet64(a));
        }
        if is_snan64(b) {
            return Some(quiet64(b));
        }
    }
    if b.is_nan() {
        return Some(a);
    }
    if a.is_nan() {
        return Some(b);
    }
    None
}

/// f16 min/max/med3 on raw bits (a conversion to f32 would quiet a signalling NaN first).
fn f16_nan(h: u16) -> bool {
    h & 0x7c00 == 0x7c00 && h & 0x3ff != 0
}
fn f16_snan(h: u16) -> bool {
    f16_nan(h) && h & 0x200 == 0
}
fn nan_rule16(a: u16, b: u16, ieee: bool) -> Option<u16> {
    if ieee {
        if f16_snan(a) {
            return Some(a | 0x200);
        }
        if f16_snan(b) {
            return Some(b | 0x200);
        }
    }
    if f16_nan(b) {
        return Some(a);
    }
    if f16_nan(a) {
        return Some(b);
    }
    None
}
pub fn min16_ieee(a: u16, b: u16, ieee: bool) -> u16 {
    if let Some(r) = nan_rule16(a, b, ieee) {
        return r;
    }
    let (x, y) = (f16_to_f32(a), f16_to_f32(b));
    let lt = x < y || (x == 0.0 && y == 0.0 && a & 0x8000 != 0 && b & 0x8000 == 0);
    if lt { a } else { b }
}
pub fn max16_ieee(a: u16, b: u16, ieee: bool) -> u16 {
    if let Some(r) = nan_rule16(a, b, ieee) {
        return r;
    }
    let (x, y) = (f16_to_f32(a), f16_to_f32(b));
    let gt = x > y || (x == 0.0 && y == 0.0 && a & 0x8000 == 0 && b & 0x8000 != 0);
    if gt { a } else { b }
}
pub fn med3_16_ieee(a: u16, b: u16, c: u16, ieee: bool) -> u16 {
    if f16_nan(a) || f16_nan(b) || f16_nan(c) {
        return min16_ieee(min16_ieee(a, b, ieee), c, ieee);
    }
    let m = f16_to_f32(max16_ieee(max16_ieee(a, b, ieee), c, ieee));
    if m == f16_to_f32(a) {
        max16_ieee(b, c, ieee)
    } else if m == f16_to_f32(b) {
        max16_ieee(a, c, ieee)
    } else {
        max16_ieee(a, b, ieee)
    }
}

// ---------------------------------------------------------------- exact rounding helpers

/// f64 -> f16 bits, round to nearest even, in one rounding (f32 in between would round twice).
pub fn f64_to_f16(x: f64) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 48) & 0x8000) as u16;
    let exp = ((b >> 52) & 0x7ff) as i64;
    let man = b & ((1u64 << 52) - 1);
    if exp == 0x7ff {
        return sign | 0x7c00 | if man != 0 { 0x200 | ((man >> 42) as u16 & 0x3ff) } else { 0 };
    }
    if exp == 0 {
        return sign;
    } // f64 zero or subnormal: far below f16's range
    let e = exp - 1023 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let m = man | (1u64 << 52);
    let (r, rest, half) = if e >= 1 {
        (((e as u64) << 10) | (man >> 42), man & ((1u64 << 42) - 1), 1u64 << 41)
    } else {
        // subnormal: units of 2^-24; value = m * 2^(exp - 1075)
        let shift = (1051 - exp) as u32;
        if shift >= 64 {
            return sign;
        }
        (m >> shift, m & ((1u64 << shift) - 1), 1u64 << (shift - 1))
    };
    let r = if rest > half || (rest == half && r & 1 == 1) { r + 1 } else { r };
    sign | r as u16
}

/// Error-free sum: s + e == a + b exactly (|a| >= |b| not required).
#[inline]
pub fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

/// Round the exact value s + e (e the error term of s) to f32 once.
pub fn round_pair_f32(s: f64, e: f64) -> f32 {
    let r = s as f32;
    if e == 0.0 || !s.is_finite() || r as f64 == s {
        return r;
    }
    if r.is_infinite() {
        // exactly at the overflow threshold (MAX + half an ulp) and a bit below: MAX
        let limit = f32::MAX as f64 + 2f64.powi(103);
        return if s.abs() == limit && (e < 0.0) == (s > 0.0) { f32::MAX.copysign(r) } else { r };
    }
    // s lies strictly between r and its neighbour r2 on s's side; only an exact midpoint
    // needs the error term's sign to break the tie
    let toward_up = (r as f64) < s;
    let r2 = next_f32(r, toward_up);
    let r2v = if r2.is_infinite() { (r as f64) + (r as f64 - next_f32(r, !toward_up) as f64) } else { r2 as f64 };
    let mid = (r as f64 + r2v) * 0.5;
    if s != mid {
        return r;
    }
    if (e > 0.0) == toward_up { r2 } else { r }
}

/// Round s + e to f16 once.
pub fn round_pair_f16(s: f64, e: f64) -> u16 {
    let r = f64_to_f16(s);
    let rv = f16_to_f32(r) as f64;
    if e == 0.0 || !s.is_finite() || rv == s {
        return r;
    }
    if r & 0x7fff == 0x7c00 {
        return if s.abs() == 65520.0 && (e < 0.0) == (s > 0.0) { (r & 0x8000) | 0x7bff } else { r };
    }
    let toward_up = rv < s;
    let r2 = next_f16(r, toward_up);
    let r2v = if r2 & 0x7fff == 0x7c00 {
        rv + (rv - f16_to_f32(next_f16(r, !toward_up)) as f64)
    } else {
        f16_to_f32(r2) as f64
    };
    let mid = (rv + r2v) * 0.5;
    if s != mid {
        return r;
    }
    if (e > 0.0) == toward_up { r2 } else { r }
}

/// The adjacent f32 above (`up`) or below.
fn next_f32(x: f32, up: bool) -> f32 {
    let b = x.to_bits();
    if x == 0.0 {
        return f32::from_bits(if up { 1 } else { 0x8000_0001 });
    }
    let away = (x > 0.0) == up;
    f32::from_bits(if away { b + 1 } else { b - 1 })
}
fn next_f16(x: u16, up: bool) -> u16 {
    if x & 0x7fff == 0 {
        return if up { 1 } else { 0x8001 };
    }
    let pos = x & 0x8000 == 0;
    if pos == up { x + 1 } else { x - 1 }
}

/// fma(a, b, c) rounded once to f32, for a and b of at most 24 significant bits (f32 or f16
/// values): the product is exact in f64 and the sum is carried error-free.
#[inline]
pub fn fma_once_f32(a: f64, b: f64, c: f64) -> f32 {
    let p = a * b;
    if !p.is_finite() || !c.is_finite() {
        return (p + c) as f32;
    }
    let (s, e) = two_sum(p, c);
    round_pair_f32(s, e)
}
/// fma(a, b, c) of f16/f32 operands rounded once to f16 (v_fma_f16, v_fma_mixlo_f16).
#[inline]
pub fn fma_once_f16(a: f64, b: f64, c: f64) -> u16 {
    let p = a * b;
    if !p.is_finite() || !c.is_finite() {
        return f64_to_f16(p + c);
    }
    let (s, e) = two_sum(p, c);
    round_pair_f16(s, e)
}

/// v_div_fixup_f32 (ISA pseudo-code): q quotient, d denominator, n numerator.
pub fn div_fixup32(q: f32, d: f32, n: f32) -> f32 {
    let neg = d.is_sign_negative() != n.is_sign_negative();
    let signed = |x: f32| if neg { -x } else { x };
    let exp = |x: f32| ((x.to_bits() >> 23) & 0xff) as i32;
    if n.is_nan() {
        return quiet32(n);
    }
    if d.is_nan() {
        return quiet32(d);
    }
    if (d == 0.0 && n == 0.0) || (d.is_infinite() && n.is_infinite()) {
        return f32::from_bits(DEFAULT_NAN32);
    }
    if d == 0.0 || n.is_infinite() {
        return signed(f32::INFINITY);
    }
    if d.is_infinite() || n == 0.0 {
        return signed(0.0);
    }
    // quotient below half the smallest denormal: UNDERFLOW (0 when rounding to nearest)
    if exp(n) - exp(d) < -150 {
        return signed(0.0);
    }
    // The pseudo-code tests exponent(S1) == 255 here, which cannot hold (an inf or NaN
    // denominator was handled above). Read as the quotient's exponent: a quotient that
    // overflowed during the Newton-Raphson steps (inf, or the NaN of inf - inf) is OVERFLOW,
    // which makes LLVM's division of huge quotients inf, as IEEE division is.
    if exp(q) == 255 {
        return signed(f32::INFINITY);
    }
    signed(q.abs())
}
/// v_div_fixup_f16 (no underflow/overflow cases in the pseudo-code), on f32 values of f16s.
pub fn div_fixup16(q: f32, d: f32, n: f32) -> f32 {
    let neg = d.is_sign_negative() != n.is_sign_negative();
    let signed = |x: f32| if neg { -x } else { x };
    if n.is_nan() {
        return quiet32(n);
    }
    if d.is_nan() {
        return quiet32(d);
    }
    if (d == 0.0 && n == 0.0) || (d.is_infinite() && n.is_infinite()) {
        return f32::from_bits(DEFAULT_NAN32);
    }
    if d == 0.0 || n.is_infinite() {
        return signed(f32::INFINITY);
    }
    if d.is_infinite() || n == 0.0 {
        return signed(0.0);
    }
    signed(q.abs())
}
/// v_div_fixup_f64.
pub fn div_fixup64(q: f64, d: f64, n: f64) -> f64 {
    let neg = d.is_sign_negative() != n.is_sign_negative();
    let signed = |x: f64| if neg { -x } else { x };
    let exp = |x: f64| ((x.to_bits() >> 52) & 0x7ff) as i64;
    if n.is_nan() {
        return quiet64(n);
    }
    if d.is_nan() {
        return quiet64(d);
    }
    if (d == 0.0 && n == 0.0) || (d.is_infinite() && n.is_infinite()) {
        return f64::from_bits(DEFAULT_NAN64);
    }
    if d == 0.0 || n.is_infinite() {
        return signed(f64::INFINITY);
    }
    if d.is_infinite() || n == 0.0 {
        return signed(0.0);
    }
    if exp(n) - exp(d) < -1075 {
        return signed(0.0);
    }
    // exponent(S1) == 2047 cannot hold here: the quotient's, as in div_fixup32
    if exp(q) == 2047 {
        return signed(f64::INFINITY);
    }
    signed(q.abs())
}

/// sin/cos of x turns (v_sin_f32 computes sin(x * 2 pi)), with exact argument reduction: whole
/// turns vanish (sin(-MaxFloat) = 0), quarter turns are exact (cos(0.25) = +0).
pub fn sin_turns(x: f64, cos: bool) -> f64 {
    if !x.is_finite() {
        return f64::NAN;
    }
    if x == 0.0 && !cos {
        return x;
    }
    let r = x - x.round_ties_even(); // exact, in [-0.5, 0.5]
    let t = 4.0 * r; // quarter turns, exact
    let k = t.round_ties_even();
    let a = (t - k) * std::f64::consts::FRAC_PI_2;
    let q = ((k as i64 + if cos { 1 } else { 0 }) & 3) as u8;
    match q {
        0 => a.sin(),
        1 => a.cos(),
        2 => 0.0 - a.sin(),
        _ => 0.0 - a.cos(),
    }
}
