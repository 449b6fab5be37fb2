//! IQ3_XXS × Q8_K with AVX-512 VBMI + BITALG: the grid and sign decoding of a whole
//! 256-weight super-block in a handful of 512-bit instructions, no scalar table loads.
//!
//! A super-block has 64 grid indices (one per 4 weights), 8 scale-and-sign words (one per 32
//! weights: four 7-bit sign fields + 4-bit scale). Instead of expanding each index to its four
//! bytes in weight order (a gather), we keep the bytes **transposed**: `g_j[kk]` = byte j of
//! grid entry `idx[kk]`, for j = 0..3, which is four `vpermi2b` lookups (256-byte table split
//! in two 128-byte halves, blended on the index's top bit; see below for the code tables). The activations are transposed the
//! same way once per call (`Acts::perm`, byte `j*64 + kk` = quant `4kk + j`), so `vpdpbusd` on
//! (g_j, x_j) pairs weight 4kk+j with activation 4kk+j and the dot is unchanged.
//! `vpermi2b` is the expensive instruction here (~0.5/cycle on Zen 4), so the tables hold 3-bit
//! level codes, two per byte (`tables::iq3xxs_codes`): 4 lookups instead of 8, then `vpshufb`
//! maps codes to the 8 magnitudes.
//!
//! Signs: `vpmultishiftqb` cuts the four 7-bit fields out of each word, `vpopcntb` gives each
//! field's parity (ggml's 8th sign bit makes the count even), and `vpshufbitqmb` gathers, for
//! each j, the sign bits of weights 4kk+j into a 64-bit mask, which negates the weight bytes
//! with one masked subtract per super-block (shared by all activation columns); the
//! activations are fed as u8 (x + 128) with the bias removed through -128·Σ weights.
//! i32 lane m of the dot holds weights of sub-block m/2, so one per-lane f32 scale vector
//! applies the 8 sub-block scales.
#![allow(unsafe_op_in_unsafe_fn)]

use crate::acts::Acts;
use crate::tensor::QTensor;
use core::arch::x86_64::*;

pub(crate) const READY: bool = true;

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")]
#[inline]
unsafe fn dot_iq3<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
    let nb = k / 256;
    // Checked by the dispatcher (`has_avx512_iq3`); an empty table here would be a bug.
    let Some(codes) = super::tables::iq3xxs_codes() else { return [f32::NAN; NC] };
    let mut tb = [[_mm512_setzero_si512(); 4]; 2];
    for h in 0..2 {
        for q in 0..4 {
            tb[h][q] = _mm512_loadu_si512(codes.0[h].as_ptr().add(64 * q).cast());
        }
    }
    let mut lv = [0u8; 16];
    lv[..8].copy_from_slice(&super::tables::IQ3_LEVELS);
    let levels = _mm512_broadcast_i32x4(_mm_loadu_si128(lv.as_ptr().cast()));
    let m7 = _mm512_set1_epi8(7);
    // vpshufbitqmb control: result bit (8q + r) of mask j = bit (4r + j) of qword q.
    let mut cb = [[0u8; 64]; 4];
    for (j, c) in cb.iter_mut().enumerate() {
        for (i, v) in c.iter_mut().enumerate() {
            *v = (4 * (i % 8) + j) as u8;
        }
    }
    let ctrl = [
        _mm512_loadu_si512(cb[0].as_ptr().cast()),
        _mm512_loadu_si512(cb[1].as_ptr().cast()),
        _mm512_loadu_si512(cb[2].as_ptr().cast()),
        _mm512_loadu_si512(cb[3].as_ptr().cast()),
    ];
    // vpmultishiftqb control: bytes 0..3 of each qword take bits 0, 7, 14, 21 onwards.
    let ms = _mm512_set1_epi64(0x15_0E_07_00);
    let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let m7f = _mm512_set1_epi8(0x7F);
    let one8 = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); NC];
    for i in 0..nb {
        let p = w.add(i * 98);
        let idx = _mm512_loadu_si512(p.add(2).cast());
        let hi = _mm512_movepi8_mask(idx);
        let mut g = [zero; 4];
        for h in 0..2 {
            let lo = _mm512_permutex2var_epi8(tb[h][0], idx, tb[h][1]);
            let up = _mm512_permutex2var_epi8(tb[h][2], idx, tb[h][3]);
            let c = _mm512_mask_blend_epi8(hi, lo, up);
            // Two 3-bit level codes per byte → the two magnitudes (vpshufb on 8 levels).
            g[2 * h] = _mm512_shuffle_epi8(levels, _mm512_and_si512(c, m7));
            g[2 * h + 1] = _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(c, 3), m7));
        }
        let aux = _mm256_loadu_si256(p.add(66).cast());
        let s7 = _mm512_and_si512(_mm512_multishift_epi64_epi8(ms, _mm512_cvtepu32_epi64(aux)), m7f);
        let par = _mm512_and_si512(_mm512_popcnt_epi8(s7), one8);
        let sw = _mm512_or_si512(s7, _mm512_slli_epi16(par, 7));
        let neg = [
            _mm512_bitshuffle_epi64_mask(sw, ctrl[0]),
            _mm512_bitshuffle_epi64_mask(sw, ctrl[1]),
            _mm512_bitshuffle_epi64_mask(sw, ctrl[2]),
            _mm512_bitshuffle_epi64_mask(sw, ctrl[3]),
        ];
        // Scale 2*(aux >> 28) + 1 == (aux >> 27) | 1, duplicated to both lanes of a sub-block.
        let ls = _mm512_or_si512(
            _mm512_srli_epi32(_mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(aux)), 27),
            _mm512_set1_epi32(1),
        );
        if NC == 1 {
            // One column (matvec): negating the activations costs the same as negating the
            // weights and needs no bias correction.
            let x = a.perm.as_ptr().add(c0 * k + 256 * i);
            let b80 = _mm512_set1_epi8(-128);
            let mut sp = [zero; 2];
            for j in 0..4 {
                let xj = _mm512_xor_si512(_mm512_loadu_si512(x.add(64 * j).cast()), b80);
                let sx = _mm512_mask_sub_epi8(xj, neg[j], zero, xj);
                sp[j & 1] = _mm512_dpbusd_epi32(sp[j & 1], g[j], sx);
            }
            let t = _mm512_cvtepi32_ps(_mm512_mullo_epi32(_mm512_add_epi32(sp[0], sp[1]), ls));
            let da = *a.d.get_unchecked(c0 * nb + i);
            acc[0] = _mm512_fmadd_ps(t, _mm512_set1_ps(f16(p) * 0.25 * da), acc[0]);
            continue;
        }
        // Signs go on the weights (shared by the NC columns): gs_j = ±g_j in [-62, 62]. The
        // activations come biased to u8 (x + 128, `Acts::perm`), so each column's sum starts
        // at -128·Σ gs (also shared): Σ (x+128)·gs - 128·Σ gs = Σ x·gs.
        let gs: [__m512i; 4] = core::array::from_fn(|j| _mm512_mask_sub_epi8(g[j], neg[j], zero, g[j]));
        let b80 = _mm512_set1_epi8(-128);
        let mut wsum = _mm512_dpbusd_epi32(zero, b80, gs[0]);
        for gj in &gs[1..] {
            wsum = _mm512_dpbusd_epi32(wsum, b80, *gj);
        }
        let corr = _mm512_sub_epi32(zero, wsum);
        // Per-lane float scale: ls · d_w / 4 (d_x multiplies per column).
        let wls = _mm512_mul_ps(_mm512_cvtepi32_ps(ls), _mm512_set1_ps(f16(p) * 0.25));
        for c in 0..NC {
            let col = c0 + c;
            let x = a.perm.as_ptr().add(col * k + 256 * i);
            // Two dot chains: the per-super-block dependency chain limits how many
            // super-blocks the out-of-order core overlaps.
            let mut sp = [corr, zero];
            for j in 0..4 {
                let xj = _mm512_loadu_si512(x.add(64 * j).cast());
                sp[j & 1] = _mm512_dpbusd_epi32(sp[j & 1], xj, gs[j]);
            }
            let t = _mm512_cvtepi32_ps(_mm512_add_epi32(sp[0], sp[1]));
            let da = *a.d.get_unchecked(col * nb + i);
            acc[c] = _mm512_fmadd_ps(t, _mm512_mul_ps(wls, _mm512_set1_ps(da)), acc[c]);
        }
    }
    let mut out = [0f32; NC];
    for c in 0..NC {
        out[c] = _mm512_reduce_add_ps(acc[c]);
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")]
#[inline]
unsafe fn f16(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

rows_driver!(
    "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg",
    rows_iq3_xxs,
    dot_iq3,
    8
);
