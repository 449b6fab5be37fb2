//! AVX2 versions of the ggml-order Q4_K and Q6_K kernels (`ggml_q4k`, `ggml_q6k`), bit for
//! bit the same results: the integer sums are formed with `vpmaddubsw`/`vpmaddwd` (exact: u8
//! quants <= 63 times i8 activations never saturate the i16 pair sums) in any order, and the
//! f32 operations are the scalar kernels' ones in their order. A weight super-block is decoded
//! once and used for every activation column.
#![allow(unsafe_op_in_unsafe_fn)]

use core::arch::x86_64::*;

use crate::acts::Acts;
use crate::tensor::QTensor;

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn h2f(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// Columns handled per pass over a row (decoded super-block reused across them).
const NCOL: usize = 4;

/// Q4_K: see `ggml_q4k` for the float order.
///
/// # Safety
/// The [`crate::tensor::RowsFn`] contract, AVX2 + FMA + F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_q4k(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 256;
    let m4 = _mm256_set1_epi8(0x0F);
    let gemm_cols = a.n - a.n % 4;
    for r in r0..r1 {
        let row = w.data.as_ptr().add(r * rb);
        if a.n == 1 {
            super::common::prefetch_ahead(row, rb);
        }
        let mut c0 = 0;
        while c0 < a.n {
            let nc = (a.n - c0).min(NCOL);
            let mut acc = [0f32; NCOL];
            let mut accm = [0f32; NCOL];
            for ib in 0..nb {
                let b = row.add(ib * 144);
                let dw = h2f(b);
                let dmin = h2f(b.add(2));
                let (scu, mnu) = super::common::k4_scales_u64(&*(b.add(4) as *const [u8; 12]));
                // i16 lanes 2s, 2s+1 = min_s (madd pairs them with bsum[2s], bsum[2s+1]).
                let m8 = _mm_cvtsi64_si128(mnu as i64);
                let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                // Scale s broadcast to every i16 lane (vpshufb of the 8 widened scales).
                let sc8 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scu as i64)));
                let mut lo = [_mm256_setzero_si256(); 4];
                let mut hi = [_mm256_setzero_si256(); 4];
                for j in 0..4 {
                    let x = _mm256_loadu_si256(b.add(16 + 32 * j).cast());
                    lo[j] = _mm256_and_si256(x, m4);
                    hi[j] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
                }
                let s16: [__m256i; 8] = core::array::from_fn(|s| {
                    _mm256_shuffle_epi8(sc8, _mm256_set1_epi16((((2 * s + 1) << 8) | (2 * s)) as i16))
                });
                for c in 0..nc {
                    let col = c0 + c;
                    let ab = a.raw.as_ptr().add(col * a.raw_row + ib * 292);
                    let da = (ab as *const f32).read_unaligned();
                    let q8 = ab.add(4);
                    // min_s * (bsum[2s] + bsum[2s+1]) per i32 lane s.
                    let mv = _mm256_madd_epi16(_mm256_loadu_si256(ab.add(260).cast()), mins);
                    let mut pair = [_mm256_setzero_si256(); 4];
                    for j in 0..4 {
                        let ql = _mm256_loadu_si256(q8.add(64 * j).cast());
                        let qh = _mm256_loadu_si256(q8.add(64 * j + 32).cast());
                        let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[j], ql), s16[2 * j]);
                        let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[j], qh), s16[2 * j + 1]);
                        pair[j] = _mm256_add_epi32(pl, ph);
                    }
                    if col < gemm_cols {
                        // The 4-row GEMM applies the scales after every pair of sub-blocks.
                        let mut mn = [0i32; 8];
                        _mm256_storeu_si256(mn.as_mut_ptr().cast(), mv);
                        for j in 0..4 {
                            let iacc = hsum_i32(pair[j]);
                            let imin = mn[2 * j] + mn[2 * j + 1];
                            acc[c] = (iacc as f32).mul_add(dw * da, acc[c]);
                            accm[c] = (imin as f32).mul_add(dmin * da, accm[c]);
                        }
                    } else {
                        let s =
                            _mm256_add_epi32(_mm256_add_epi32(pair[0], pair[1]), _mm256_add_epi32(pair[2], pair[3]));
                        let iacc = hsum_i32(s);
                        let imin = hsum_i32(mv);
                        acc[c] = (iacc as f32).mul_add(dw * da, acc[c]);
                        accm[c] = (imin as f32).mul_add(dmin * da, accm[c]);
                    }
                }
            }
            for c in 0..nc {
                *y.add((c0 + c) * w.rows + r) = acc[c] - accm[c];
            }
            c0 += nc;
        }
    }
}

/// Q6_K: see `ggml_q6k` for the float order.
///
/// # Safety
/// The [`crate::tensor::RowsFn`] contract, AVX2 + FMA + F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_q6k(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.cols / 256;
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let m32 = _mm256_set1_epi32(32);
    for r in r0..r1 {
        let row = w.data.as_ptr().add(r * rb);
        if a.n == 1 {
            super::common::prefetch_ahead(row, rb);
        }
        let mut c0 = 0;
        while c0 < a.n {
            let nc = (a.n - c0).min(NCOL);
            let mut acc = [_mm256_setzero_ps(); NCOL];
            for ib in 0..nb {
                let b = row.add(ib * 210);
                let (ql, qh, sc) = (b, b.add(128), b.add(192));
                let dw = h2f(b.add(208));
                // q[g]: the 32 6-bit quants of group g (elements 32g..32g+32).
                let mut q = [_mm256_setzero_si256(); 8];
                for n in 0..2 {
                    let l0 = _mm256_loadu_si256(ql.add(64 * n).cast());
                    let l1 = _mm256_loadu_si256(ql.add(64 * n + 32).cast());
                    let h = _mm256_loadu_si256(qh.add(32 * n).cast());
                    q[4 * n] =
                        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
                    q[4 * n + 1] =
                        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
                    q[4 * n + 2] =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
                    q[4 * n + 3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(h, 2), m30),
                    );
                }
                // i16 lanes 0-7 (i32 lanes 0-3) take scale 2g, lanes 8-15 scale 2g+1.
                let scs: [__m256i; 8] = core::array::from_fn(|g| {
                    _mm256_set_m128i(
                        _mm_set1_epi16(*sc.add(2 * g + 1) as i8 as i16),
                        _mm_set1_epi16(*sc.add(2 * g) as i8 as i16),
                    )
                });
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.cast()));
                for c in 0..nc {
                    let col = c0 + c;
                    let ab = a.raw.as_ptr().add(col * a.raw_row + ib * 292);
                    let da = (ab as *const f32).read_unaligned();
                    let q8 = ab.add(4);
                    let mut s = _mm256_setzero_si256();
                    for g in 0..8 {
                        let x = _mm256_loadu_si256(q8.add(32 * g).cast());
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], x), scs[g]));
                    }
                    // - 32 (bsum[2L] sc[2L] + bsum[2L+1] sc[2L+1]) per lane L.
                    let bm = _mm256_madd_epi16(_mm256_loadu_si256(ab.add(260).cast()), sc16);
                    s = _mm256_sub_epi32(s, _mm256_mullo_epi32(bm, m32));
                    let d = _mm256_set1_ps(da * dw);
                    acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[c]);
                }
            }
            for c in 0..nc {
                let mut l = [0f32; 8];
                _mm256_storeu_ps(l.as_mut_ptr(), acc[c]);
                *y.add((c0 + c) * w.rows + r) = super::common::hsum8(&l);
            }
            c0 += nc;
        }
    }
}
