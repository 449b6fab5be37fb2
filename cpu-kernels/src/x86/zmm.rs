//! 512-bit AVX-512 kernels for the types prompt processing depends on (Q4_K, Q6_K, the
//! 32-element signed formats Q8_0 / Q5_0 / Q4_0 / IQ4_NL, and Q4_1).
//!
//! Why a separate family: the 256-bit kernels spend 3-4 instructions per 32 weights per
//! activation column (dot, scale multiply, add); here one zmm covers two scale groups and the
//! sub-block scales are applied by `vpdpwssd` straight from the `vpmaddubsw` i16 pairs
//! (2 instructions per 64 weights per column).
//! Q4_K: a 64-byte load of `qs` gives, after masking, sub-blocks (0,2) [low nibbles] and (1,3)
//! [high nibbles]. The activations are permuted once per call to that order (`Acts::perm`,
//! sub-blocks 0,2,1,3,4,6,5,7), so no weight shuffling is needed.
//! Q6_K: 64 bytes of `ql` + the 32 `qh` bytes broadcast to both halves and shifted by a per-half
//! amount (`vpsrlvw`) give 64 natural-order 6-bit quants; the -32 offset is folded in through
//! the Q8_K `bsums` like the 256-bit kernel.
#![allow(unsafe_op_in_unsafe_fn)]

use super::q0_decode as dec;
use crate::acts::Acts;
use crate::tensor::QTensor;
use core::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn h2f(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `vpermw` index: i16 lanes 0..16 take element `lo`, lanes 16..32 element `hi`.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
fn idx2(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn dot_q4_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
    let nb = k / 256;
    let m4 = _mm512_set1_epi8(0x0F);
    // Scale of each i16 lane of the four maddubs results (sub-blocks 0|2, 1|3, 4|6, 5|7).
    let sidx = [idx2(0, 2), idx2(1, 3), idx2(4, 6), idx2(5, 7)];
    let mut acc = [_mm512_setzero_ps(); NC];
    let mut accm = [_mm256_setzero_ps(); NC];
    for i in 0..nb {
        let p = w.add(i * 144);
        let (sc, mn) = super::common::k4_scales_u64(&*p.add(4).cast::<[u8; 12]>());
        let scmn = _mm_set_epi64x(mn as i64, sc as i64);
        let sc16 = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(scmn));
        // dmin · m_s per sub-block; the activations carry d_x · Σx per sub-block (`Acts::mb`).
        let wm8 = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(scmn, scmn))),
            _mm256_set1_ps(h2f(p.add(2))),
        );
        let s = sidx.map(|ix| _mm512_permutexvar_epi16(ix, sc16));
        let v0 = _mm512_loadu_si512(p.add(16).cast());
        let v1 = _mm512_loadu_si512(p.add(80).cast());
        let q = [
            _mm512_and_si512(v0, m4),
            _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
            _mm512_and_si512(v1, m4),
            _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
        ];
        let d = h2f(p);
        for c in 0..NC {
            let col = c0 + c;
            let x = a.perm.as_ptr().add(col * k + i * 256);
            let mut isum = _mm512_setzero_si512();
            for t in 0..4 {
                let xv = _mm512_loadu_si512(x.add(64 * t).cast());
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[t], xv), s[t]);
            }
            let da = *a.d.get_unchecked(col * nb + i);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * da), acc[c]);
            accm[c] = _mm256_fmadd_ps(wm8, _mm256_loadu_ps(a.mb.as_ptr().add((col * nb + i) * 8)), accm[c]);
        }
    }
    let mut out = [0f32; NC];
    for c in 0..NC {
        out[c] = _mm512_reduce_add_ps(acc[c]) - hsum256(accm[c]);
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn dot_q6_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
    let nb = k / 256;
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(3);
    // qh bits for the low (q1|q2) and high (q3|q4) vectors: shift 0|2 and 4|6 per 256-bit half.
    let sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    let sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    let mut g8 = [0i16; 32];
    for (l, v) in g8.iter_mut().enumerate() {
        *v = (l / 8) as i16;
    }
    let group8 = _mm512_loadu_si512(g8.as_ptr().cast());
    // i16 lane L of vector t (0..4) belongs to 16-weight group 4t + L/8.
    let gidx: [__m512i; 4] = core::array::from_fn(|t| _mm512_add_epi16(group8, _mm512_set1_epi16(4 * t as i16)));
    let mut acc = [_mm512_setzero_ps(); NC];
    for i in 0..nb {
        let p = w.add(i * 210);
        let scp = p.add(192);
        let sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128(scp.cast()));
        let sc16 = _mm512_castsi256_si512(sc16y);
        let mut q = [_mm512_setzero_si512(); 4];
        let mut s = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h).cast()));
            let hl = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_lo), m3), 4);
            let hh = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m3), 4);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), hl);
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hh);
            // 16-weight groups: vector 2h covers groups 8h..8h+4, vector 2h+1 groups 8h+4..8h+8;
            // i16 lane L of the maddubs result belongs to group base + L/8.
            s[2 * h] = _mm512_permutexvar_epi16(gidx[2 * h], sc16);
            s[2 * h + 1] = _mm512_permutexvar_epi16(gidx[2 * h + 1], sc16);
        }
        let d = h2f(p.add(208));
        for c in 0..NC {
            let col = c0 + c;
            let x = a.qs.as_ptr().add(col * k + i * 256);
            let bs = _mm256_loadu_si256(a.bsums.as_ptr().add((col * nb + i) * 16).cast());
            // Σ_g sc_g · 32 · bsum_g: the "-32" offset of every 6-bit quant.
            let bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16y), 5);
            let mut isum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(bias));
            for t in 0..4 {
                let xv = _mm512_loadu_si512(x.add(64 * t).cast());
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[t], xv), s[t]);
            }
            let da = *a.d.get_unchecked(col * nb + i);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * da), acc[c]);
        }
    }
    let mut out = [0f32; NC];
    for c in 0..NC {
        out[c] = _mm512_reduce_add_ps(acc[c]);
    }
    out
}

/// Two consecutive 32-element blocks of a signed format decoded to 64 i8 weights.
macro_rules! signed_pair_kernel {
    ($name:ident, $bsz:expr, |$p:ident| $decode:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
        #[inline]
        unsafe fn $name<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 32;
            let mut acc = [_mm512_setzero_ps(); NC];
            let lanes = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1);
            // Callers guarantee an even block count (see `pair_rows!` in x86/mod.rs).
            let mut b = 0;
            while b + 2 <= nb {
                let $p = w.add(b * $bsz);
                let wq: __m512i = $decode;
                // Σ (x+128)·w = Σ x·w + 128·Σ w: start each column's sum at -128·Σ w
                // (weights only, shared by the columns) and feed x ^ 0x80 as the u8 operand.
                let corr = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), wq),
                );
                // Both f16 scales in one vcvtph2ps, spread to [d0 ×8, d1 ×8].
                let h01 = (core::ptr::read_unaligned($p.cast::<u16>()) as u32)
                    | ((core::ptr::read_unaligned($p.add($bsz).cast::<u16>()) as u32) << 16);
                let dw =
                    _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(h01 as i32))));
                for c in 0..NC {
                    let col = c0 + c;
                    let xu = _mm512_loadu_si512(a.perm.as_ptr().add(col * k + b * 32).cast());
                    let dp = _mm512_dpbusd_epi32(corr, xu, wq);
                    let dx2 = _mm_castpd_ps(_mm_load_sd(a.d.as_ptr().add(col * nb + b).cast()));
                    let dx = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(dx2));
                    acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), dw), dx, acc[c]);
                }
                b += 2;
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = _mm512_reduce_add_ps(acc[c]);
            }
            out
        }
    };
}

signed_pair_kernel!(dot_q8_0, dec::Q8_0_BYTES, |p| dec::q8_0(p));
signed_pair_kernel!(dot_q4_0, dec::Q4_0_BYTES, |p| dec::q4_0(p));
signed_pair_kernel!(dot_q5_0, dec::Q5_0_BYTES, |p| dec::q5_0(p));
signed_pair_kernel!(dot_iq4_nl, dec::IQ4_NL_BYTES, |p| dec::iq4_nl(p));

/// Q4_1 (`d·q + m`, unsigned nibbles) against Q8_1 activations, two blocks per zmm: the
/// nibbles are the u8 operand of `vpdpbusd` with the signed activation quants (no sign
/// trick), and `m · s_x` (`s_x` = Q8_1's stored `d_x · Σ x`) is accumulated on all eight lanes
/// of its block, so the lane sum is 8x the term, divided out exactly at the end.
#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")]
#[inline]
unsafe fn dot_q4_1<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
    let nb = k / 32;
    let lanes = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1);
    // [d0, m0, d1, m1] → d: lanes 0-7 d0, 8-15 d1; m likewise.
    let d_idx = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(2), 1);
    let m_idx = _mm512_inserti64x4(_mm512_set1_epi32(1), _mm256_set1_epi32(3), 1);
    let mut acc = [_mm512_setzero_ps(); NC];
    let mut macc = [_mm512_setzero_ps(); NC];
    // Callers guarantee an even block count (see `pair_rows!` in x86/mod.rs).
    let mut b = 0;
    while b + 2 <= nb {
        let p = w.add(b * 20);
        let wq = dec::q4_1(p);
        let dm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(
            0,
            0,
            core::ptr::read_unaligned(p.add(20).cast::<i32>()),
            core::ptr::read_unaligned(p.cast::<i32>()),
        )));
        let dw = _mm512_permutexvar_ps(d_idx, dm);
        let mw = _mm512_permutexvar_ps(m_idx, dm);
        for c in 0..NC {
            let col = c0 + c;
            let x = _mm512_loadu_si512(a.qs.as_ptr().add(col * k + b * 32).cast());
            let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, x);
            let dx = _mm512_permutexvar_ps(
                lanes,
                _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(a.d.as_ptr().add(col * nb + b).cast()))),
            );
            let sx = _mm512_permutexvar_ps(
                lanes,
                _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(a.s.as_ptr().add(col * nb + b).cast()))),
            );
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), dw), dx, acc[c]);
            macc[c] = _mm512_fmadd_ps(mw, sx, macc[c]);
        }
        b += 2;
    }
    let mut out = [0f32; NC];
    for c in 0..NC {
        out[c] = _mm512_reduce_add_ps(acc[c]) + _mm512_reduce_add_ps(macc[c]) * 0.125;
    }
    out
}

rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", rows_q4_k, dot_q4_k, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", pair_rows_q4_1, dot_q4_1, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", rows_q6_k, dot_q6_k, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", pair_rows_q8_0, dot_q8_0, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", pair_rows_q4_0, dot_q4_0, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", pair_rows_q5_0, dot_q5_0, 8);
rows_driver!("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq", pair_rows_iq4_nl, dot_iq4_nl, 8);
