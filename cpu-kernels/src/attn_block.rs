//! Blocked attention for up to 8 queries at once (AVX2 + FMA + F16C): every K and V row is
//! loaded and converted once per group of 8 queries instead of once per query, which turns
//! the q·k and p·v loops from load-bound dot products into 8-wide FMA blocks.
//!
//! Same math as [`crate::attention_one`] per query; used by [`crate::attention_causal`] when
//! the CPU has AVX2 and `head_dim % 8 == 0`.
#![allow(unsafe_op_in_unsafe_fn)]

use crate::attention::{AttnParams, KvRows};
use crate::ops;
use core::arch::x86_64::*;

/// Queries per block.
pub(crate) const G: usize = 8;

/// 8 consecutive values of row `j` at column `d` as f32 (int8 rows already scaled).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8(r: &KvRows, j: usize, d: usize) -> __m256 {
    match *r {
        KvRows::F32 { data, stride } => _mm256_loadu_ps(data.as_ptr().add(j * stride + d)),
        KvRows::F16 { data, stride } => _mm256_cvtph_ps(_mm_loadu_si128(data.as_ptr().add(j * stride + d).cast())),
        KvRows::I8 { data, scales, stride, scale_stride } => {
            let q = _mm_loadl_epi64(data.as_ptr().add(j * stride + d).cast());
            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_mul_ps(f, _mm256_set1_ps(*scales.get_unchecked(j * scale_stride)))
        }
    }
}

/// Horizontal sums of 8 vectors, as one vector [Σa0, .., Σa7].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum8(a: &[__m256; G]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))
}

/// e^x for 8 lanes: x = n·ln2 + r, |r| <= ln2/2, e^r by its degree-6 Taylor polynomial
/// (relative error < 3e-7), times 2^n built in the exponent bits. -inf gives exactly 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    let is_ninf = _mm256_cmp_ps(x, _mm256_set1_ps(f32::NEG_INFINITY), _CMP_EQ_OQ);
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(core::f32::consts::LOG2_E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // Cody-Waite split of ln 2 keeps r accurate for large |n|.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    _mm256_andnot_ps(is_ninf, _mm256_mul_ps(p, pow2n))
}

/// Softmax in place with [`exp8`]; all -inf gives zeros like [`ops::softmax`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax8(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let m = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let n = x.len();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
        _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
        sum = _mm256_add_ps(sum, e);
        i += 8;
    }
    let mut t = [0f32; 8];
    _mm256_storeu_ps(t.as_mut_ptr(), sum);
    let mut total: f32 = t.iter().sum();
    for v in &mut x[i..] {
        *v = (*v - max).exp();
        total += *v;
    }
    let inv = _mm256_set1_ps(1.0 / total);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(x.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), inv));
        i += 8;
    }
    for v in &mut x[i..] {
        *v *= 1.0 / total;
    }
}

/// Attention of `nq` (1..=8) queries: query g is `q[g]` (head_dim values), sees cache rows
/// `lo[g]..=hi[g]`; writes `out[g][..head_dim]`. `scores` is scratch.
///
/// # Safety
/// AVX2/FMA/F16C present; `head_dim % 8 == 0`; every `q[g]`/`out[g]` has `head_dim` values;
/// `k`/`v` hold rows up to `max(hi)` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend_block(
    q: &[&[f32]],
    lo: &[usize],
    hi: &[usize],
    head_dim: usize,
    k: &KvRows,
    v: &KvRows,
    params: &AttnParams,
    scores: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let nq = q.len().min(G);
    let jlo = lo[..nq].iter().copied().min().unwrap_or(0);
    let jhi = hi[..nq].iter().copied().max().unwrap_or(0);
    let nk = jhi + 1 - jlo;
    // Missing queries of a partial block repeat the last one (computed, never stored).
    let qp: [*const f32; G] = core::array::from_fn(|g| q[g.min(nq - 1)].as_ptr());
    scores.clear();
    scores.resize(G * nk, 0.0);
    let scale = _mm256_set1_ps(params.scale);
    let mut tmp = [0f32; G];
    for j in jlo..=jhi {
        let mut acc = [_mm256_setzero_ps(); G];
        let mut d = 0;
        while d < head_dim {
            let kc = load8(k, j, d);
            for g in 0..G {
                acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qp[g].add(d)), kc, acc[g]);
            }
            d += 8;
        }
        _mm256_storeu_ps(tmp.as_mut_ptr(), _mm256_mul_ps(hsum8(&acc), scale));
        for g in 0..G {
            *scores.get_unchecked_mut(g * nk + (j - jlo)) = tmp[g];
        }
    }
    for g in 0..nq {
        let row = &mut scores[g * nk..(g + 1) * nk];
        if let Some(cap) = params.softcap
            && cap != 0.0
        {
            ops::softcap(row, cap);
        }
        // Causal / window mask: positions outside lo..=hi of this query.
        for (t, s) in row.iter_mut().enumerate() {
            let j = jlo + t;
            if j < lo[g] || j > hi[g] {
                *s = f32::NEG_INFINITY;
            }
        }
        softmax8(row);
    }
    for g in nq..G {
        scores[g * nk..(g + 1) * nk].iter_mut().for_each(|s| *s = 0.0);
    }
    let mut d = 0;
    while d < head_dim {
        let mut acc = [_mm256_setzero_ps(); G];
        for j in jlo..=jhi {
            let vc = load8(v, j, d);
            for g in 0..G {
                let p = _mm256_broadcast_ss(scores.get_unchecked(g * nk + (j - jlo)));
                acc[g] = _mm256_fmadd_ps(p, vc, acc[g]);
            }
        }
        for g in 0..nq {
            _mm256_storeu_ps(out[g].as_mut_ptr().add(d), acc[g]);
        }
        d += 8;
    }
}
