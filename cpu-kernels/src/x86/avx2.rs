//! AVX2 path: u8×i8 dot products with `vpmaddubsw` (pairs to i16; every weight×activation pair
//! sum here stays below 2^15 so it never saturates) + `vpmaddwd`.
#![allow(unsafe_op_in_unsafe_fn)]

use crate::acts::Acts;
use crate::tensor::{QTensor, RowsFn};
use core::arch::x86_64::*;
use quant::GgmlType;

common_helpers!("avx2,fma,f16c,bmi2");

/// acc + Σ₄ u·s per i32 lane.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
}

/// acc + scale · Σ u·s, with the scale vector from [`scale_vec`] (i16 lanes here).
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
#[inline]
fn dps(acc: __m256i, u: __m256i, s: __m256i, sc: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc))
}

/// Scale for bytes 0..16 (`lo`) and 16..32 (`hi`) of a [`dps`] operand.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
#[inline]
fn scale_vec(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Byte i = 0xFF if bit i of m is set.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
#[inline]
fn bits(m: u32) -> __m256i {
    let v = _mm256_set1_epi32(m as i32);
    // Byte i takes byte i/8 of m, then tests bit i%8.
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bm = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shuf), bm), bm)
}

fam_q8!("avx2,fma,f16c,bmi2");
fam_k!("avx2,fma,f16c,bmi2");
fam_f!("avx2,fma,f16c,bmi2");
fam_lowbit!("avx2,fma,f16c,bmi2");

pub(crate) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    kernel_table!(ty)
}
