//! Prompt-sized products (`Gemm::Tiles`, at least `gemm_q0::MIN_COLS` columns) for Q4_K and
//! Q6_K against Q8_K activations: the 16-row tiles of `gemm_q0` for the K-quants.
//!
//! A tile of 16 rows is decoded once into a scratch where lane i of a zmm is row i: per
//! super-block, 64 quads of 16 rows x 4 unsigned quants (Q4_K 0..15, Q6_K 0..63), then 16
//! vectors of 16 f32 per-row factors. Per sub-block and column, `vpdpbusd` with the column's
//! 4 activation quants broadcast from memory sums the sub-block's products for 16 rows exactly
//! (8 instructions for Q4_K's 32 quants, 4 for Q6_K's 16), then one convert, one multiply by
//! `d_x` and one FMA with the rows' `d·scale`:
//! * Q4_K (`w = d·sc_j·q - dmin·m_j`): factor vectors 0..8 are `d·sc_j`, 8..16 `dmin·m_j`,
//!   whose term is one more FMA with `d_x·Σx` of the sub-block (`Acts::mb`);
//! * Q6_K (`w = d·sc_k·(q - 32)`): the sum starts at `-32·Σx` of the 16 quants (the Q8_K
//!   `bsums`), factor vectors 0..16 are `d·sc_k`.
//!
//! Numerics: exact integer sums per sub-block, one rounding each, accumulated in sub-block
//! order; not the order of the default kernels (a named mode, like `gemm_q0`).
#![allow(unsafe_op_in_unsafe_fn)]

use crate::acts::Acts;
use crate::tensor::QTensor;
use core::arch::x86_64::*;

const TILE_ROWS: usize = 16;
const COLS: usize = 8;
/// Scratch bytes per super-block: 64 quads of 64 bytes, 16 factor vectors of 64 bytes.
const SB_BYTES: usize = 64 * 64 + 16 * 64;

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn h2f(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(p.cast::<u16>()) as i32)))
}

/// One Q4_K super-block (144 bytes) → its 256 quants in element order and 16 factors.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn decode_q4_k(p: *const u8, q: &mut [u8; 256], f: &mut [f32; 16]) {
    let (d, dmin) = (h2f(p), h2f(p.add(2)));
    let (sc, mn) = super::common::k4_scales(&*p.add(4).cast::<[u8; 12]>());
    for j in 0..8 {
        f[j] = d * sc[j] as f32;
        f[8 + j] = dmin * mn[j] as f32;
    }
    let m4 = _mm256_set1_epi8(0x0F);
    for jp in 0..4 {
        // 32 bytes: low nibbles are sub-block 2jp, high nibbles sub-block 2jp + 1.
        let v = _mm256_loadu_si256(p.add(16 + 32 * jp).cast());
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * jp).cast(), _mm256_and_si256(v, m4));
        _mm256_storeu_si256(q.as_mut_ptr().add(64 * jp + 32).cast(), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
}

/// One Q6_K super-block (210 bytes) → its 256 quants (0..63) in element order and 16 factors.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn decode_q6_k(p: *const u8, q: &mut [u8; 256], f: &mut [f32; 16]) {
    let d = h2f(p.add(208));
    for k in 0..16 {
        f[k] = d * *p.add(192 + k) as i8 as f32;
    }
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    for h in 0..2 {
        let a = _mm256_loadu_si256(p.add(64 * h).cast());
        let b = _mm256_loadu_si256(p.add(64 * h + 32).cast());
        let hb = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
        let parts = [
            _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30),
            ),
        ];
        for (t, v) in parts.iter().enumerate() {
            _mm256_storeu_si256(q.as_mut_ptr().add(128 * h + 32 * t).cast(), *v);
        }
    }
}

/// Rows `r..r + rn` (rn ≤ 16) decoded into `scratch` (see the module doc); rows past `rn`
/// get zero quants and factors.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn decode_tile<const Q6: bool>(w: &QTensor, rb: usize, r: usize, rn: usize, scratch: &mut [u8]) {
    let nsb = w.cols / 256;
    let (bsz, s) = (if Q6 { 210 } else { 144 }, scratch.as_mut_ptr());
    let (mut q, mut f) = ([0u8; 256], [0f32; 16]);
    for i in 0..TILE_ROWS {
        for sb in 0..nsb {
            if i < rn {
                let p = w.data.as_ptr().add((r + i) * rb + sb * bsz);
                if Q6 { decode_q6_k(p, &mut q, &mut f) } else { decode_q4_k(p, &mut q, &mut f) }
            } else {
                (q, f) = ([0u8; 256], [0f32; 16]);
            }
            let t = s.add(sb * SB_BYTES);
            for g in 0..64 {
                let quad = core::ptr::read_unaligned(q.as_ptr().add(4 * g).cast::<u32>());
                core::ptr::write_unaligned(t.add(64 * g + 4 * i).cast::<u32>(), quad);
            }
            for (v, x) in f.iter().enumerate() {
                core::ptr::write_unaligned(t.add(4096 + 64 * v + 4 * i).cast::<f32>(), *x);
            }
        }
    }
}

/// The 16-row tile against columns `c0..c0 + NC`: one f32 zmm (16 rows) per column.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn tile_cols<const Q6: bool, const NC: usize>(tile: *const u8, k: usize, a: &Acts, c0: usize) -> [__m512; NC] {
    let nsb = k / 256;
    let mut acc = [_mm512_setzero_ps(); NC];
    // Q4_K: 8 sub-blocks of 8 quads; Q6_K: 16 of 4.
    let (nsub, nq) = if Q6 { (16, 4) } else { (8, 8) };
    for sb in 0..nsb {
        let t = tile.add(sb * SB_BYTES);
        for j in 0..nsub {
            let mut wq = [_mm512_setzero_si512(); 8];
            for g in 0..nq {
                wq[g] = _mm512_loadu_si512(t.add(64 * (j * nq + g)).cast());
            }
            let fac = _mm512_loadu_ps(t.add(4096 + 64 * j).cast());
            let fmin = if Q6 { fac } else { _mm512_loadu_ps(t.add(4096 + 64 * (8 + j)).cast()) };
            for c in 0..NC {
                let col = c0 + c;
                let x = a.qs.as_ptr().add(col * k + sb * 256 + j * 4 * nq);
                let mut s = if Q6 {
                    _mm512_set1_epi32(-32 * *a.bsums.as_ptr().add((col * nsb + sb) * 16 + j) as i32)
                } else {
                    _mm512_setzero_si512()
                };
                for g in 0..nq {
                    s = _mm512_dpbusd_epi32(
                        s,
                        wq[g],
                        _mm512_set1_epi32(core::ptr::read_unaligned(x.add(4 * g).cast::<i32>())),
                    );
                }
                let dx = *a.d.as_ptr().add(col * nsb + sb);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(fac, _mm512_set1_ps(dx)), acc[c]);
                if !Q6 {
                    acc[c] =
                        _mm512_fnmadd_ps(fmin, _mm512_set1_ps(*a.mb.as_ptr().add((col * nsb + sb) * 8 + j)), acc[c]);
                }
            }
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn rows<const Q6: bool>(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    let (k, rows, n) = (w.cols, w.rows, a.n);
    let mut scratch = vec![0u8; (k / 256) * SB_BYTES];
    let mut r = r0;
    while r < r1 {
        let rn = (r1 - r).min(TILE_ROWS);
        decode_tile::<Q6>(w, rb, r, rn, &mut scratch);
        let mask: __mmask16 = if rn == TILE_ROWS { 0xFFFF } else { (1u16 << rn) - 1 };
        let t = scratch.as_ptr();
        let mut c = 0;
        while c + COLS <= n {
            for (i, v) in tile_cols::<Q6, COLS>(t, k, a, c).iter().enumerate() {
                _mm512_mask_storeu_ps(y.add((c + i) * rows + r), mask, *v);
            }
            c += COLS;
        }
        while c < n {
            _mm512_mask_storeu_ps(y.add(c * rows + r), mask, tile_cols::<Q6, 1>(t, k, a, c)[0]);
            c += 1;
        }
        r += rn;
    }
}

/// # Safety
/// The [`crate::tensor::RowsFn`] contract, AVX-512 with DQ present, and Q8_K activations with
/// `a.qs`, `a.d` and `a.mb` (`prepare` for Q4_K on AVX-512).
pub(crate) unsafe fn rows_q4_k(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    rows::<false>(w, rb, a, r0, r1, y)
}

/// # Safety
/// The [`crate::tensor::RowsFn`] contract, AVX-512 with DQ present, and Q8_K activations with
/// `a.qs`, `a.d` and `a.bsums`.
pub(crate) unsafe fn rows_q6_k(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    rows::<true>(w, rb, a, r0, r1, y)
}
