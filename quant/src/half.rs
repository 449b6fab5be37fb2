//! IEEE half (f16) and bfloat16 conversions, bit-exact with ggml's `GGML_FP16_TO_FP32`,
//! `GGML_FP32_TO_FP16` (round to nearest even, as F16C's `vcvtps2ph` with imm 0) and
//! `GGML_FP32_TO_BF16` (round to nearest even, NaN forced quiet).
//!
//! On amdgpu `f16_to_f32` is the hardware conversion (`v_cvt_f32_f16`, exact, so the same
//! bits); on the host it is a portable bit-twiddle so no `f16` feature gate is needed there.

/// f16 bits → f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        f16::from_bits(h) as f32
    }
    #[cfg(not(target_arch = "amdgpu"))]
    {
        f16_to_f32_soft(h)
    }
}

/// Portable f16 → f32 (used on the host; also tested against the hardware path's semantics).
#[inline]
pub const fn f16_to_f32_soft(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: value = man * 2^-24. Shift the leading one up to bit 10 and adjust
            // the exponent by the shift.
            let l = man.leading_zeros() - 21; // man < 2^10, so l >= 1
            sign | ((127 - 15 + 1 - l) << 23) | (((man << l) & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13) // inf / NaN (payload kept, stays quiet if it was)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// f32 → f16 bits, round to nearest even; overflow gives ±inf, NaN stays NaN (quiet).
#[inline]
pub const fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a >= 0x7f80_0000 {
        if a == 0x7f80_0000 {
            return sign | 0x7c00;
        }
        // NaN: keep the top payload bits, force the quiet bit (as the x86 conversion does).
        return sign | 0x7e00 | ((a >> 13) & 0x3ff) as u16;
    }
    let e = (a >> 23) as i32 - 127;
    let man = a & 0x7f_ffff;
    if e > 15 {
        return sign | 0x7c00;
    }
    if e >= -14 {
        // Normal half: keep 10 mantissa bits, round on the 13 dropped ones. A carry out of the
        // mantissa correctly bumps the exponent (and 65520.. rounds up to inf = 0x7c00).
        let mut r = (((e + 15) as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    // Subnormal half: value = m_h * 2^-24 with m_h = m * 2^(e+1), m the 24-bit significand.
    let shift = (-e - 1) as u32; // 14..
    if shift > 24 {
        return sign; // below 2^-25: rounds to zero
    }
    let m = man | 0x80_0000;
    let mut r = m >> shift;
    let rem = m & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    if rem > half || (rem == half && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

/// bf16 bits → f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub const fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 → bf16 bits, round to nearest even; NaN is kept and forced quiet (ggml semantics).
#[inline]
pub const fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // Adding 0x7fff (+1 if the kept lsb is odd) carries into the kept half exactly when the
    // dropped half is above one half ulp, or equal to it with an odd kept part.
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}
