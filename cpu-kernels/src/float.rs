//! f16 row helpers for the attention over an f16 KV cache (F16C when present).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// dot(q, f16 row)
pub(crate) fn dot_f32_f16(q: &[f32], row: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: AVX2/FMA/F16C presence checked just above.
        return unsafe { dot_f32_f16_avx2(q, row) };
    }
    q.iter().zip(row).map(|(&a, &h)| a * quant::f16_to_f32(h)).sum()
}

/// out += w * f16 row
pub(crate) fn axpy_f16(w: f32, row: &[u16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::has_avx2() {
        // SAFETY: AVX2/FMA/F16C presence checked just above.
        return unsafe { axpy_f16_avx2(w, row, out) };
    }
    for (o, &h) in out.iter_mut().zip(row) {
        *o += w * quant::f16_to_f32(h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_f16_avx2(q: &[f32], row: &[u16]) -> f32 {
    let n = q.len().min(row.len());
    // Four independent FMA chains: one chain would be bound by the 4-cycle FMA latency.
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= n bounds both slices; loadu has no alignment requirement.
            unsafe {
                let h = _mm_loadu_si128(row.as_ptr().add(i + 8 * j).cast());
                let x = _mm256_loadu_ps(q.as_ptr().add(i + 8 * j));
                *a = _mm256_fmadd_ps(x, _mm256_cvtph_ps(h), *a);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n bounds both slices.
        unsafe {
            let h = _mm_loadu_si128(row.as_ptr().add(i).cast());
            let x = _mm256_loadu_ps(q.as_ptr().add(i));
            acc[0] = _mm256_fmadd_ps(x, _mm256_cvtph_ps(h), acc[0]);
        }
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut t = [0f32; 8];
    // SAFETY: t holds 8 f32.
    unsafe { _mm256_storeu_ps(t.as_mut_ptr(), sum) };
    let mut s: f32 = t.iter().sum();
    for j in i..n {
        s += q[j] * quant::f16_to_f32(row[j]);
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_f16_avx2(w: f32, row: &[u16], out: &mut [f32]) {
    let n = out.len().min(row.len());
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n bounds both slices.
        unsafe {
            let h = _mm_loadu_si128(row.as_ptr().add(i).cast());
            let o = _mm256_loadu_ps(out.as_ptr().add(i));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_fmadd_ps(wv, _mm256_cvtph_ps(h), o));
        }
        i += 8;
    }
    for j in i..n {
        out[j] += w * quant::f16_to_f32(row[j]);
    }
}

/// FMA present (scalar `mul_add` in `#[target_feature(enable = "fma")]` code becomes one
/// instruction instead of a call to `fmaf`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_fma() -> bool {
    use std::sync::OnceLock;
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| is_x86_feature_detected!("fma"))
}
