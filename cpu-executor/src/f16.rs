//! Half-precision helpers for the KV cache: conversion, dot products and axpy over `u16`
//! (IEEE binary16) storage.
//!
//! The attention inner loops read every cached position of every layer per generated token, so
//! conversion must use the hardware (`vcvtph2ps`, F16C) rather than a bit-twiddling scalar
//! routine. The SIMD paths are picked at run time; the scalar fallback uses `quant`'s
//! conversions, which round like ggml (RNE), so both paths produce identical values up to the
//! f32 summation order.

use std::sync::OnceLock;

fn has_f16c() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Rounds `x` to the nearest binary16 value and back (what ggml does to an f32 operand of an
/// f16 matrix product).
#[inline]
pub fn round_f16(x: f32) -> f32 {
    quant::f16_to_f32(quant::f32_to_f16(x))
}

/// `dst[i] = f16(src[i])` (round to nearest even).
pub fn from_f32(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports f16c/avx2/fma (checked above); lengths are equal.
        unsafe { x86::from_f32(src, dst) };
        return;
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = quant::f32_to_f16(*s);
    }
}

/// `dst[i] = f32(src[i])`.
pub fn to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports f16c/avx2/fma (checked above); lengths are equal.
        unsafe { x86::to_f32(src, dst) };
        return;
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = quant::f16_to_f32(*s);
    }
}

/// `sum_i f32(a[i]) * b[i]`.
pub fn dot(a: &[u16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports f16c/avx2/fma (checked above); lengths are equal.
        return unsafe { x86::dot(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| quant::f16_to_f32(*x) * y).sum()
}

/// `out[i] += p * f32(v[i])`.
pub fn axpy(out: &mut [f32], p: f32, v: &[u16]) {
    assert_eq!(out.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports f16c/avx2/fma (checked above); lengths are equal.
        unsafe { x86::axpy(out, p, v) };
        return;
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o += p * quant::f16_to_f32(*x);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn from_f32(src: &[f32], dst: &mut [u16]) {
        let n = src.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices (equal lengths); unaligned loads/stores.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = quant::f32_to_f16(src[j]);
        }
    }

    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn to_f32(src: &[u16], dst: &mut [f32]) {
        let n = src.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices (equal lengths); unaligned loads/stores.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = quant::f16_to_f32(src[j]);
        }
    }

    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn dot(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len();
        let mut i = 0;
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        while i + 16 <= n {
            // SAFETY: i + 16 <= n for both slices (equal lengths); unaligned loads.
            unsafe {
                let h0 = _mm_loadu_si128(a.as_ptr().add(i) as *const __m128i);
                let h1 = _mm_loadu_si128(a.as_ptr().add(i + 8) as *const __m128i);
                acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(h0), _mm256_loadu_ps(b.as_ptr().add(i)), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(h1), _mm256_loadu_ps(b.as_ptr().add(i + 8)), acc1);
            }
            i += 16;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        let mut s: f32 = lanes.iter().sum();
        for j in i..n {
            s += quant::f16_to_f32(a[j]) * b[j];
        }
        s
    }

    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn axpy(out: &mut [f32], p: f32, v: &[u16]) {
        let n = out.len();
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices (equal lengths); unaligned loads/stores.
            unsafe {
                let h = _mm_loadu_si128(v.as_ptr().add(i) as *const __m128i);
                let o = _mm256_loadu_ps(out.as_ptr().add(i));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_fmadd_ps(_mm256_cvtph_ps(h), pv, o));
            }
            i += 8;
        }
        for j in i..n {
            out[j] += p * quant::f16_to_f32(v[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_matches_scalar() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.3) * 0.731).collect();
        let mut h = vec![0u16; x.len()];
        from_f32(&x, &mut h);
        for (a, b) in h.iter().zip(&x) {
            assert_eq!(*a, quant::f32_to_f16(*b));
        }
        let mut back = vec![0f32; x.len()];
        to_f32(&h, &mut back);
        let d = dot(&h, &x);
        let want: f32 = back.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((d - want).abs() <= 1e-3 * want.abs().max(1.0));
    }
}
