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
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n bounds both slices; loadu has no alignment requirement.
        unsafe {
            let h = _mm_loadu_si128(row.as_ptr().add(i).cast());
            let a = _mm256_loadu_ps(q.as_ptr().add(i));
            acc = _mm256_fmadd_ps(a, _mm256_cvtph_ps(h), acc);
        }
        i += 8;
    }
    let mut t = [0f32; 8];
    // SAFETY: t holds 8 f32.
    unsafe { _mm256_storeu_ps(t.as_mut_ptr(), acc) };
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
